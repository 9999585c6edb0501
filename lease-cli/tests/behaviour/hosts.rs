//! Host lists and hot standbys: a hot standby is logged and retried until promoted,
//! several hosts default to `target_session_attrs=read-write` (a primary, read-only by
//! default or not), and a frozen first host does not stop `lease run` or `lease status`
//! from reaching the next.

use crate::common::*;
use lease_proto::key_for_name;
use lease_tests::cluster::Frozen;
use lease_tests::Cluster;
use lease_tests::Replica;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::Weak;
use std::time::Instant;

/// A hot standby of the shared server, shared like it.
fn standby() -> Arc<(Arc<Cluster>, Cluster)> {
    static SHARED: Mutex<Weak<(Arc<Cluster>, Cluster)>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = shared.upgrade() {
        return s;
    }
    let c = cluster();
    let standby = c.start_standby().expect("start a hot standby");
    let s = Arc::new((c, standby));
    *shared = Arc::downgrade(&s);
    s
}

#[test]
fn a_hot_standby_is_logged_and_retried() {
    let pair = standby();
    let standby = &pair.1;
    let mut cmd = lease();
    cmd.arg("run")
        .args(["--database-url", &standby.conn_string()])
        .args(FAST)
        .args([&unique("standby"), "--", "echo", "ran"])
        // Each attempt at DEBUG; the report itself comes at most every 30 s.
        .env("LEASE_LOG", "info,lease_driver=debug");
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    r.wait_for_line(|l| l.contains("hot standby"), MS(10_000))
        .expect("a hot-standby error line");
    // Backoff and retry: still running, the command never started.
    std::thread::sleep(MS(1_000));
    assert!(r.is_alive(), "lease run exited: {:?}", texts(&r));
    let (out, err) = texts(&r);
    assert!(out.is_empty(), "the command ran: {out}");
    let tries = err.lines().filter(|l| l.contains("hot standby")).count();
    assert!(tries >= 2, "retried {tries} time(s): {err}");
    let reports = (err.lines())
        .filter(|l| l.contains("hot standby") && !l.contains("DEBUG"))
        .count();
    assert_eq!(reports, 1, "{err}");
    r.kill9().expect("kill lease");
}

/// Several hosts and no `target_session_attrs`: primaries only (`read-write`, not
/// libpq's `any`), so a standby listed first is skipped for the primary after
/// it; an explicit `any` wins and stays on the standby (retried, never leads).
#[test]
fn several_hosts_default_to_read_write_and_an_explicit_value_wins() {
    let pair = standby();
    let (primary, standby) = (&pair.0, &pair.1);
    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres",
        standby.port(),
        primary.port()
    );
    let name = unique("several-hosts");
    let script = r#"echo "start token=$LEASE_TOKEN"; exec sleep 1000"#;
    let mut cmd = lease();
    cmd.arg("run")
        .args(["--database-url", &url])
        .args(FAST)
        .args([&name, "--", "sh", "-c", script]);
    let started = Instant::now();
    let mut r = Replica::spawn(cmd).expect("spawn lease");
    let (_, line) = r
        .wait_for_line(|l| l.contains("contending for the lease"), MS(10_000))
        .expect("the connection line");
    assert!(
        line.contains("primaries only: a standby is skipped (the default with several hosts)"),
        "{line}"
    );
    r.wait_for_line(|l| l.starts_with("start"), MS(10_000))
        .unwrap_or_else(|e| panic!("the primary down the list leads: {e}\n{:?}", texts(&r)));
    let led = started.elapsed();
    assert!(
        held(primary, key_for_name(&name)),
        "not held on the primary"
    );
    let (_, err) = texts(&r);
    assert!(!err.contains("hot standby"), "{err}");
    r.sigterm().expect("SIGTERM");
    assert_eq!(r.wait_exit(MS(5_000)).expect("exits").code(), Some(0));

    // An explicit `any` (the string's keyword, or the variable) wins: the
    // standby first in the list is taken, logged and retried.
    for (url, var) in [
        (format!("{url} target_session_attrs=any"), None),
        (url.clone(), Some(("PGTARGETSESSIONATTRS", "any"))),
    ] {
        let mut cmd = lease();
        cmd.arg("run")
            .args(["--database-url", &url])
            .args(FAST)
            .args([&unique("several-any"), "--", "echo", "ran"]);
        if let Some((k, v)) = var {
            cmd.env(k, v);
        }
        let mut r = Replica::spawn(cmd).expect("spawn lease");
        let (_, line) = r
            .wait_for_line(|l| l.contains("contending for the lease"), MS(10_000))
            .expect("the connection line");
        assert!(!line.contains("primaries only"), "{line}");
        r.wait_for_line(|l| l.contains("hot standby"), MS(10_000))
            .unwrap_or_else(|e| panic!("{var:?}: on the standby: {e}\n{:?}", texts(&r)));
        assert!(r.is_alive(), "{:?}", texts(&r));
        let (out, _) = texts(&r);
        assert!(
            out.is_empty(),
            "the command ran on a standby session: {out}"
        );
        r.kill9().expect("kill lease");
    }
    eprintln!(
        "several hosts (standby first, primary second): led on the primary {led:?} after the start"
    );
}

/// A primary A, frozen (SIGSTOP of its postmaster and children: TCP connects, nothing
/// answers), and its promoted standby B: the clusters, A's freeze and `host=A,B`.
fn frozen_first_host() -> (Cluster, Cluster, Frozen, String) {
    let a = Cluster::start().expect("primary A");
    let b = a.start_standby().expect("hot standby B");
    b.promote().expect("promote B");
    let frozen = a.freeze().expect("freeze A");
    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres",
        a.port(),
        b.port()
    );
    (a, b, frozen, url)
}

/// A frozen first host, for `lease status` (its own connection, not the lease driver's):
/// with `host=A,B`, A frozen (SIGSTOP of its postmaster and children: TCP connects,
/// nothing answers) and B its promoted standby, the status comes from B within
/// `--timeout`: each host gets its share. Before the fix the whole `--timeout` went to A.
#[test]
fn status_moves_on_from_a_frozen_first_host() {
    let (_a, _b, frozen, url) = frozen_first_host();
    let mut cmd = lease();
    cmd.args(["status", "--database-url", &url, "--timeout", "4s"])
        .arg(unique("frozen-first"));
    let (st, out, err, took) = output(cmd, MS(20_000));
    eprintln!("lease status, first host frozen: {st} after {took:?}\n{out}{err}");
    drop(frozen);
    assert!(
        st.success() && out.contains("free"),
        "lease status did not answer from the second host: {st} after {took:?}: {err}"
    );
}

/// A write freeze before a cut-over (`ALTER ROLE … SET default_transaction_read_only =
/// on` on the primary), a hot standby listed first, several hosts and no
/// `target_session_attrs` (so `read-write`): `lease run` must lead on the primary and
/// `lease status` must answer from it, since no lease statement writes (lease-driver's
/// docs, "Several hosts"). Before the driver's fix the runner retried forever ("database
/// does not allow writes" from both hosts); before `lease status` connected the same way,
/// it exited 1 with that error.
#[test]
fn a_write_frozen_primary_still_serves_run_and_status() {
    let primary = Cluster::start().expect("a primary");
    let standby = primary.start_standby().expect("a hot standby");
    primary
        .sql("ALTER ROLE postgres SET default_transaction_read_only = on")
        .expect("the write freeze");
    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres",
        standby.port(),
        primary.port()
    );
    let name = unique("write-freeze");
    let mut cmd = lease();
    cmd.args(["run", "--database-url", &url])
        .args(FAST)
        .arg(&name)
        .args(["--", "sh", "-c", "echo started"]);
    let (st, out, err, took) = output(cmd, MS(20_000));
    eprintln!("lease run, write-frozen primary: {st} after {took:?}");
    assert!(
        st.success() && out.contains("started"),
        "lease run did not lead on the write-frozen primary: {st} after {took:?}:\n{err}"
    );
    let mut cmd = lease();
    cmd.args(["status", "--database-url", &url, "--timeout", "4s"])
        .arg(&name);
    let (st, out, err, took) = output(cmd, MS(20_000));
    eprintln!("lease status, write-frozen primary: {st} after {took:?}\n{out}{err}");
    assert!(
        st.success() && out.contains("free"),
        "lease status did not answer from the write-frozen primary: {st} after {took:?}: {err}"
    );
}

/// A frozen first host, with `lease run`: `host=A,B` (read-write by default with
/// several hosts), B promoted, A frozen. The runner must lead on B: A costs one share
/// of the attempt (here `--query-timeout 2s` over two hosts). Before the fix every
/// attempt timed out on A ("connection attempt timed out after 2000 ms") and nobody
/// led.
#[test]
fn run_leads_on_the_next_host_when_the_first_is_frozen() {
    let (_a, _b, frozen, url) = frozen_first_host();
    let mut cmd = lease();
    cmd.args(["run", "--database-url", &url, "--query-timeout", "2s"])
        .args(["--retry-interval", "100ms", "--heartbeat-interval", "200ms"])
        .arg(unique("frozen-first"))
        .args(["--", "sh", "-c", "echo started"]);
    let (st, out, err, took) = output(cmd, MS(20_000));
    eprintln!("lease run, first host frozen: {st} after {took:?}");
    drop(frozen);
    assert!(
        st.success() && out.contains("started"),
        "lease run did not lead on the second host: {st} after {took:?}:\n{err}"
    );
}

/// A hot standby reached first (a routine HA failover) is retryable: the
/// runner keeps retrying with backoff and leads once the server is promoted,
/// instead of exiting 1 for good.
#[test]
fn hot_standby_is_retried_until_promoted() {
    let c = cluster();
    let standby = c.start_standby().expect("start a hot standby");
    let name = unique("hole4-standby");
    let spawned = Instant::now();
    let mut r = Replica::spawn(run_sh(
        &standby.url("postgres"),
        &FAST[..6],
        &name,
        "echo started",
    ))
    .expect("spawn");
    std::thread::sleep(MS(1_000));
    let alive_at_promotion = r.is_alive();
    let promoted = spawned.elapsed();
    standby.sql("SELECT pg_promote()").expect("promote");
    let led = r.wait_for_line(|l| l == "started", MS(10_000));
    let status = exit_text(r.wait_exit(MS(0)).ok());
    let last_output = r.lines().last().map(|l| l.at.duration_since(spawned));
    eprintln!(
        "hot standby promoted at {promoted:?}: alive at promotion {alive_at_promotion}, led: \
         {}, {status} (last output at {last_output:?})",
        led.is_ok()
    );
    assert!(
        led.is_ok(),
        "`lease run` against a hot standby promoted {promoted:?} after its start never led: \
         alive at the promotion: {alive_at_promotion}, {status}, last output \
         {last_output:?} after its start; last stderr line: {}",
        last_stderr_line(&r),
    );
}
