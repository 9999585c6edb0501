//! Opening a session over a host list, as libpq does: each host in turn, each
//! with its own bounded share of the attempt, the `target_session_attrs` check
//! included.
//!
//! tokio-postgres's `Config::connect` bounds only the TCP connect by
//! `connect_timeout`: a first host that accepts connections but never answers
//! the startup (a frozen server: the kernel's listen backlog completes the
//! handshake) holds the whole attempt, and the next host is never tried. So
//! the driver walks the list itself: it hands [`Runtime::connect`] one host at
//! a time and bounds each by its share ([`share`]), from the socket to the
//! end of the `target_session_attrs` check, which the driver runs itself
//! ([`check_attrs`]) so that every runtime gets it and it is bounded too;
//! `read-write` there means a primary (not in recovery), see [`check_attrs`].
//!
//! A lease session that opens on one of several hosts is also compared with
//! the other listed hosts ([`stale`]): a primary on an older WAL timeline
//! than another listed primary is a stale old primary, closed before the
//! session's setup, and the walk goes on to the next host.

use std::fmt::Write as _;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use lease_proto::SessionError;
use tokio_postgres::config::{Host, LoadBalanceHosts, TargetSessionAttrs};
use tokio_postgres::Config;

use crate::runtime::{not_a_primary, Runtime, Session, SessionEvent};

/// An open session and the host's configuration (one host).
pub(crate) type Opened = (Config, Box<dyn Session>);

/// One configuration per host of `config`, in the order to try them
/// (shuffled with `load_balance_hosts=random`): its host, its `hostaddr` and
/// its port, every other setting as in `config`. A single host comes back
/// as it is.
pub(crate) fn split(config: &Config, seed: u64) -> Vec<Config> {
    let (hosts, addrs, ports) = (
        config.get_hosts(),
        config.get_hostaddrs(),
        config.get_ports(),
    );
    let n = hosts.len().max(addrs.len());
    if n <= 1 {
        return vec![config.clone()];
    }
    let mut order: Vec<usize> = (0..n).collect();
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        let mut x = seed | 1;
        for i in (1..n).rev() {
            // xorshift64: enough to spread replicas over the list.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
    }
    order
        .into_iter()
        .map(|i| {
            let mut one = without_hosts(config);
            match hosts.get(i) {
                Some(Host::Tcp(name)) => {
                    one.host(name);
                }
                #[cfg(unix)]
                Some(Host::Unix(path)) => {
                    one.host_path(path);
                }
                None => {}
            }
            if let Some(addr) = addrs.get(i) {
                one.hostaddr(*addr);
            }
            if let Some(port) = ports.get(i).or(ports.first()) {
                one.port(*port);
            }
            one
        })
        .collect()
}

/// `config` without its hosts, `hostaddr`s and ports (tokio-postgres has no
/// way to remove them: every other setting is copied; the unit test compares
/// the result field by field through `Config`'s `PartialEq`).
fn without_hosts(config: &Config) -> Config {
    let mut c = Config::new();
    if let Some(user) = config.get_user() {
        c.user(user);
    }
    if let Some(password) = config.get_password() {
        c.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        c.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        c.options(options);
    }
    if let Some(name) = config.get_application_name() {
        c.application_name(name);
    }
    c.ssl_mode(config.get_ssl_mode());
    c.ssl_negotiation(config.get_ssl_negotiation());
    if let Some(t) = config.get_connect_timeout() {
        c.connect_timeout(*t);
    }
    if let Some(t) = config.get_tcp_user_timeout() {
        c.tcp_user_timeout(*t);
    }
    c.keepalives(config.get_keepalives());
    c.keepalives_idle(config.get_keepalives_idle());
    if let Some(i) = config.get_keepalives_interval() {
        c.keepalives_interval(i);
    }
    if let Some(r) = config.get_keepalives_retries() {
        c.keepalives_retries(r);
    }
    c.target_session_attrs(config.get_target_session_attrs());
    c.channel_binding(config.get_channel_binding());
    c.load_balance_hosts(config.get_load_balance_hosts());
    c
}

/// How long each of `hosts` hosts may take, from the socket to the
/// `target_session_attrs` check: `connect_timeout` if given (libpq: per host), at most
/// the attempt's bound (`attempt`, the machine's query timeout) divided among
/// the hosts, so that every host is tried within one attempt. `None`: one
/// host and no `connect_timeout` (the machine's bound alone).
pub(crate) fn share(
    connect_timeout: Option<Duration>,
    hosts: usize,
    attempt: Duration,
) -> Option<Duration> {
    let fair = (hosts > 1).then(|| attempt / hosts as u32);
    match (connect_timeout, fair) {
        (Some(t), Some(f)) => Some(t.min(f)),
        (t, f) => t.or(f),
    }
}

/// A host's name for messages: `host:port`, `hostaddr:port` or the socket path.
pub(crate) fn label(config: &Config) -> String {
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match (config.get_hosts().first(), config.get_hostaddrs().first()) {
        (_, Some(addr)) => format!("{addr}:{port}"),
        (Some(Host::Tcp(name)), None) => format!("{name}:{port}"),
        #[cfg(unix)]
        (Some(Host::Unix(dir)), None) => format!("{}/.s.PGSQL.{port}", dir.display()),
        (None, None) => "?".to_owned(),
    }
}

/// A session on the first of `hosts` that opens (and passes its
/// `target_session_attrs` check) within `share` each, with that host's
/// configuration; else the last host's error, with every host's error in its
/// message when there are several. For a second connection to a session's
/// host (the pooler probe, the watch session): no stale-primary check.
pub(crate) async fn open<R: Runtime>(
    runtime: Arc<R>,
    hosts: Vec<Config>,
    share: Option<Duration>,
) -> Result<Opened, SessionError> {
    walk(runtime, hosts, share, None).await
}

/// [`open`] for a lease session: with several hosts, a host that opens is
/// also compared with the other listed hosts ([`stale`]), and skipped when
/// one of them is a primary on a newer timeline. `unchecked`
/// remembers that a host's timeline could not be read, so that it is logged
/// once per locker.
pub(crate) async fn open_lease_session<R: Runtime>(
    runtime: Arc<R>,
    hosts: Vec<Config>,
    share: Option<Duration>,
    unchecked: Arc<AtomicBool>,
) -> Result<Opened, SessionError> {
    walk(runtime, hosts, share, Some(&unchecked)).await
}

async fn walk<R: Runtime>(
    runtime: Arc<R>,
    hosts: Vec<Config>,
    share: Option<Duration>,
    unchecked: Option<&AtomicBool>,
) -> Result<Opened, SessionError> {
    let several = hosts.len() > 1;
    let mut errors: Vec<(String, SessionError)> = Vec::new();
    // Hosts that failed in this walk without an answer of their server
    // (timed out, refused, reset): not asked again by the stale-primary
    // check, where a frozen one would cost its share a second time.
    let mut silent = vec![false; hosts.len()];
    for (i, host) in hosts.iter().enumerate() {
        let host = host.clone();
        let label = label(&host);
        let attempt = one(&*runtime, host.clone(), share);
        let result = match share {
            None => attempt.await,
            Some(share) => {
                let expired = SessionError::other(format!(
                    "connection attempt timed out after {} ms",
                    share.as_millis()
                ));
                bounded(&*runtime, share, attempt)
                    .await
                    .unwrap_or(Err(expired))
            }
        };
        match result {
            Ok(mut session) => {
                let others: Vec<&Config> = (hosts.iter().enumerate())
                    .filter(|&(j, _)| j != i && !silent[j])
                    .map(|(_, other)| other)
                    .collect();
                let skip = match unchecked {
                    Some(unchecked) if !others.is_empty() => {
                        stale(&*runtime, &mut *session, &label, &others, share, unchecked).await
                    }
                    _ => None,
                };
                match skip {
                    // Dropping the session closes it: nothing was tried there.
                    Some(e) => errors.push((label, e)),
                    None => return Ok((host, session)),
                }
            }
            Err(e) => {
                // A hot standby, or a SQLSTATE: the server answered.
                silent[i] = e.code.is_none() && e.message != not_a_primary().message;
                errors.push((label, e));
            }
        }
    }
    // The error that classifies the attempt: a host's configuration error
    // (a wrong password, an unknown database: the same on every host, and
    // trying again cannot help), else the last host's.
    let classifier = (errors.iter().position(|(_, e)| e.is_configuration()))
        .unwrap_or(errors.len().saturating_sub(1));
    if classifier < errors.len() {
        let chosen = errors.remove(classifier);
        errors.push(chosen);
    }
    let Some((last_label, mut last)) = errors.pop() else {
        return Err(SessionError::other("no host given"));
    };
    if several {
        // The classifying error first.
        let mut message = format!("{} (at {last_label}", last.message);
        for (label, e) in &errors {
            let _ = write!(message, "; {label}: {}", e.message);
        }
        message.push(')');
        last.message = message;
    }
    Err(last)
}

/// One host: the runtime's connection (without `target_session_attrs`: the
/// driver checks it, bounded with the rest), then the check.
async fn one<R: Runtime>(
    runtime: &R,
    mut host: Config,
    share: Option<Duration>,
) -> Result<Box<dyn Session>, SessionError> {
    let attrs = host.get_target_session_attrs();
    host.target_session_attrs(TargetSessionAttrs::Any);
    if let Some(share) = share {
        // The runtime's own per-address bound, where it has one, within the share.
        let t = host
            .get_connect_timeout()
            .map_or(share, |t| (*t).min(share));
        host.connect_timeout(t);
    }
    let mut session = runtime.connect(host).await?;
    check_attrs(&mut *session, attrs).await?;
    Ok(session)
}

/// The stale-primary check of a host list: `Some(why)` when `session` (on
/// `me`, a host that just opened) is a primary on an older WAL timeline than
/// a primary among `others`, the other listed hosts: an old primary that an
/// HA tool has not fenced yet (a frozen one that resumed before it was
/// demoted, or one whose HA agent is frozen) while a standby was promoted.
/// Leading there would overlap the rightful leader on the promoted server,
/// with a larger fencing token. One WARN names both hosts and timelines; the
/// caller closes the session and tries the next host (the newer primary,
/// when it comes later in the list; else the walk fails and starts again
/// from the first host after a backoff). Also `Some` when the session
/// itself ends or does not answer within `share` during the check.
///
/// Costs one short connection to each other host (in parallel, each within
/// `share`: the setup waits for the slowest), every time a lease session
/// opens on one of several hosts. Hosts that failed earlier in this walk
/// without an answer of their server (timed out, refused, reset) are not
/// asked again (a frozen host would cost a second share; a runtime may
/// report its own connect timeout as an error); a hot standby or a host
/// that answered with an error is. A host that cannot be reached, or is in recovery, is no
/// newer primary. A timeline that cannot be read (`EXECUTE` revoked from
/// the role, a session that cannot tell) leaves the check off for that
/// host, logged once per locker (`unchecked`).
async fn stale<R: Runtime>(
    runtime: &R,
    session: &mut dyn Session,
    me: &str,
    others: &[&Config],
    share: Option<Duration>,
    unchecked: &AtomicBool,
) -> Option<SessionError> {
    let mine = session.primary_timeline();
    let mine = within(runtime, share, alone(session, mine)).await;
    let mine = match mine {
        Ok(Some(timeline)) => timeline,
        // In recovery: no lease is taken there (the setup retries it).
        Ok(None) => return None,
        Err(e) if answered(&e) => {
            not_checked(unchecked, me, &e);
            return None;
        }
        // The session ended or went silent meanwhile: the next host.
        Err(e) => return Some(e),
    };
    let others = all(others.iter().map(|&host| async move {
        (label(host), timeline_of(runtime, host.clone(), share).await)
    }))
    .await;
    let mut newest: Option<(String, i64)> = None;
    for (host, timeline) in others {
        match timeline {
            Ok(Some(t)) if t > mine && newest.as_ref().is_none_or(|(_, n)| t > *n) => {
                newest = Some((host, t));
            }
            Ok(_) => {}
            // The server answered, and not with a timeline: a privilege
            // revoked, a function missing.
            Err(e) if answered(&e) => not_checked(unchecked, &host, &e),
            Err(e) => tracing::debug!(
                host,
                error = %e,
                "stale-primary check: a listed host did not answer; not compared"
            ),
        }
    }
    let (newer, t) = newest?;
    tracing::warn!(
        host = me,
        timeline = mine,
        newer_host = newer.as_str(),
        newer_timeline = t,
        "{me} is a primary on timeline {mine}, but {newer} is a primary on the newer timeline \
         {t}: {me} is a stale old primary (a failover the HA tool has not finished fencing); \
         no lease is taken there, trying the next host in the list"
    );
    Some(SessionError::other(format!(
        "a stale primary on timeline {mine}: {newer} is a primary on the newer timeline {t}"
    )))
}

/// The WAL timeline of `host` on a short connection of its own (`None`: in
/// recovery), within `share`.
async fn timeline_of<R: Runtime>(
    runtime: &R,
    mut host: Config,
    share: Option<Duration>,
) -> Result<Option<i64>, SessionError> {
    host.target_session_attrs(TargetSessionAttrs::Any);
    let attempt = async {
        let mut session = one(runtime, host, share).await?;
        let timeline = session.primary_timeline();
        alone(&mut *session, timeline).await
    };
    within(runtime, share, attempt).await
}

/// `f` within `limit` (if any), else a timeout error.
async fn within<R: Runtime, T>(
    runtime: &R,
    limit: Option<Duration>,
    f: impl Future<Output = Result<T, SessionError>>,
) -> Result<T, SessionError> {
    match limit {
        None => f.await,
        Some(limit) => bounded(runtime, limit, f).await.unwrap_or_else(|| {
            Err(SessionError::other(format!(
                "no answer within {} ms",
                limit.as_millis()
            )))
        }),
    }
}

/// Whether `e` is the server's answer (a SQLSTATE that does not mean the
/// connection, the server's resources or its availability: classes 08, 53
/// and 57), or a reply the driver could not read: the check cannot be made
/// there, however often it is tried.
fn answered(e: &SessionError) -> bool {
    match &e.code {
        Some(code) => !["08", "53", "57"]
            .iter()
            .any(|class| code.starts_with(class)),
        // Without a SQLSTATE: the session's own word that it cannot tell
        // (every such message names the timeline), else the network's.
        None => e.message.contains("timeline"),
    }
}

/// A host whose timeline could not be read: one WARN per locker, then DEBUG.
fn not_checked(unchecked: &AtomicBool, host: &str, e: &SessionError) {
    if unchecked.swap(true, Ordering::Relaxed) {
        tracing::debug!(host, error = %e, "stale-primary check: timeline not readable");
        return;
    }
    tracing::warn!(
        host,
        error = %e,
        "cannot read the WAL timeline of {host}: with several hosts, a stale old primary (a \
         primary on an older timeline than another listed host's) is not detected there; \
         logged once (docs/guarantees.md, the HA condition)"
    );
}

/// Every future of `futures`, polled together; their outputs in order.
async fn all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(value) => *out = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// `f`, or `None` once `limit` has passed on the runtime's timer.
pub(crate) async fn bounded<R: Runtime, T>(
    runtime: &R,
    limit: Duration,
    f: impl Future<Output = T>,
) -> Option<T> {
    let mut timer = runtime.timer(runtime.now() + limit);
    let mut f = pin!(f);
    poll_fn(|cx| {
        if let Poll::Ready(out) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// The `target_session_attrs` check. `read-write` asks for a primary
/// (libpq's `primary`: `pg_is_in_recovery()` is false), not libpq's
/// read-write session (`SHOW transaction_read_only` is `off`): no lease
/// statement writes, and a primary whose sessions default to read-only
/// (`default_transaction_read_only = on`, a write freeze before a cut-over)
/// still gives mutual exclusion, where libpq's check would skip it and the
/// locker would retry forever. `read-only` keeps libpq's meaning (refuses
/// `transaction_read_only = off`).
async fn check_attrs(
    session: &mut dyn Session,
    attrs: TargetSessionAttrs,
) -> Result<(), SessionError> {
    match attrs {
        TargetSessionAttrs::ReadWrite => {
            let in_recovery = session.in_recovery();
            if alone(session, in_recovery).await? {
                return Err(not_a_primary());
            }
            Ok(())
        }
        TargetSessionAttrs::ReadOnly => {
            let read_only = session.read_only();
            if !alone(session, read_only).await? {
                return Err(SessionError::other("database is not read-only"));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// `reply`, a statement's reply on `session`, polling the session meanwhile
/// (nobody else polls it yet): its end is an error.
pub(crate) async fn alone<T>(
    session: &mut dyn Session,
    reply: impl Future<Output = Result<T, SessionError>>,
) -> Result<T, SessionError> {
    let mut reply = pin!(reply);
    poll_fn(|cx| {
        if let Poll::Ready(result) = reply.as_mut().poll(cx) {
            return Poll::Ready(result);
        }
        loop {
            match session.poll_event(cx) {
                Poll::Pending => return Poll::Pending,
                // Notices and notifications: not for this statement.
                Poll::Ready(SessionEvent::Notification { .. } | SessionEvent::Notice(_)) => {}
                Poll::Ready(SessionEvent::Ended(Some(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(SessionEvent::Ended(None)) => {
                    return Poll::Ready(Err(SessionError::other(
                        "the connection closed before the reply",
                    )))
                }
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_keeps_every_other_setting() {
        let every = "user=u password=p dbname=d options='-c a=b' application_name=n \
                     sslmode=require sslnegotiation=direct connect_timeout=7 \
                     tcp_user_timeout=3 keepalives=0 keepalives_idle=11 \
                     keepalives_interval=12 keepalives_retries=4 \
                     target_session_attrs=read-write channel_binding=require \
                     load_balance_hosts=disable";
        let config: Config =
            format!("host=a,/tmp/s,c hostaddr=10.0.0.1,10.0.0.2,10.0.0.3 port=1,2,3 {every}")
                .parse()
                .unwrap();
        let each = split(&config, 0);
        let expected = [
            "host=a hostaddr=10.0.0.1 port=1",
            "host=/tmp/s hostaddr=10.0.0.2 port=2",
            "host=c hostaddr=10.0.0.3 port=3",
        ];
        assert_eq!(each.len(), 3);
        for (one, want) in each.iter().zip(expected) {
            let want: Config = format!("{want} {every}").parse().unwrap();
            assert_eq!(one, &want);
        }
        // One port for every host.
        let config: Config = "host=a,b port=9 user=u".parse().unwrap();
        let ports: Vec<_> = split_ports(&config);
        assert_eq!(ports, [vec![9], vec![9]]);
        // No port: tokio-postgres's default applies to each.
        let config: Config = "host=a,b user=u".parse().unwrap();
        assert_eq!(split_ports(&config), [Vec::<u16>::new(), Vec::new()]);
        // One host: as it is.
        let config: Config = "host=a port=1 user=u".parse().unwrap();
        assert_eq!(split(&config, 0), [config]);
    }

    fn split_ports(config: &Config) -> Vec<Vec<u16>> {
        split(config, 0)
            .iter()
            .map(|c| c.get_ports().to_vec())
            .collect()
    }

    #[test]
    fn random_load_balancing_shuffles_the_hosts() {
        let config: Config = "host=a,b,c,d load_balance_hosts=random user=u"
            .parse()
            .unwrap();
        let firsts: std::collections::BTreeSet<String> = (0..64u64)
            .map(|seed| label(&split(&config, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))[0]))
            .collect();
        assert!(firsts.len() > 1, "{firsts:?}");
        let mut all: Vec<String> = split(&config, 42).iter().map(label).collect();
        all.sort();
        assert_eq!(all, ["a:5432", "b:5432", "c:5432", "d:5432"]);
    }

    #[test]
    fn only_an_answer_turns_the_stale_primary_check_off() {
        let coded = |code: &str| SessionError {
            code: Some(code.to_owned()),
            message: "m".to_owned(),
            config: false,
        };
        // Revoked, missing: the check cannot be made there.
        assert!(answered(&coded("42501")));
        assert!(answered(&coded("42883")));
        // The connection, the server's resources or its availability: not compared.
        for code in ["08006", "53300", "57P01", "57P03"] {
            assert!(!answered(&coded(code)), "{code}");
        }
        assert!(!answered(&SessionError::other(
            "connection attempt timed out"
        )));
        assert!(!answered(&SessionError::other("no answer within 500 ms")));
        assert!(answered(&SessionError::other(
            "this session cannot read the server's WAL timeline"
        )));
    }

    #[test]
    fn each_host_gets_its_share_of_the_attempt() {
        let s = Duration::from_secs;
        assert_eq!(share(None, 1, s(10)), None);
        assert_eq!(share(Some(s(2)), 1, s(10)), Some(s(2)));
        assert_eq!(share(None, 2, s(10)), Some(s(5)));
        assert_eq!(share(Some(s(2)), 2, s(10)), Some(s(2)));
        assert_eq!(share(Some(s(9)), 2, s(10)), Some(s(5)));
    }
}
