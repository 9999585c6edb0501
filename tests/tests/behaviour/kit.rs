//! Self-tests of the test kit against the real PostgreSQL and pgbouncer binaries.

use lease_tests::monotonic_nanos;
use lease_tests::pid_alive;
use lease_tests::Cluster;
use lease_tests::FaultProxy;
use lease_tests::KitError;
use lease_tests::Mode;
use lease_tests::PgBouncer;
use lease_tests::PoolMode;
use lease_tests::Replica;
use lease_tests::Stream;
use std::io::ErrorKind;
use std::io::Read;
use std::io::Write;
use std::net::SocketAddr;
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::Duration;
use std::time::Instant;
use tokio_postgres::Client;
use tokio_postgres::NoTls;

async fn connect(conn: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(conn, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {conn}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

async fn select(client: &Client, n: i32) -> i32 {
    client
        .query_one("SELECT $1::int", &[&n])
        .await
        .expect("query")
        .get(0)
}

/// The state letter of `pid` in /proc (R, S, T, Z, ...).
fn proc_state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .unwrap_or("")
        .trim()
        .chars()
        .next()
        .unwrap_or('?')
}

#[test]
fn cluster_restart_crash_and_start_again() -> Result<(), KitError> {
    let t = Instant::now();
    let mut cluster = Cluster::start()?;
    eprintln!("Cluster::start: {:?}", t.elapsed());
    let port = cluster.port();
    assert_eq!(cluster.host(), "127.0.0.1");
    assert_eq!(
        cluster.url("db"),
        format!("postgres://postgres@127.0.0.1:{port}/db")
    );
    assert_eq!(
        cluster.conn_string(),
        format!("host=127.0.0.1 port={port} user=postgres dbname=postgres")
    );
    assert!(cluster.bindir().join("initdb").is_file());
    assert!(cluster
        .socket_dir()
        .join(format!(".s.PGSQL.{port}"))
        .exists());
    assert_eq!(cluster.sql("SELECT 1")?, "1");
    assert_eq!(cluster.sql("SHOW fsync")?, "off");
    assert!(cluster.sql("SELEC 1").is_err());

    let t = Instant::now();
    cluster.restart()?;
    eprintln!("restart: {:?}", t.elapsed());
    assert_eq!(cluster.port(), port);
    // Asynchronous commit is on for speed: make this commit durable before the crash.
    cluster.sql("SET synchronous_commit = on; CREATE TABLE t AS SELECT 7 AS x")?;

    let t = Instant::now();
    cluster.crash()?;
    eprintln!("crash: {:?}", t.elapsed());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(cluster.sql("SELECT 1").is_err());
    assert!(matches!(cluster.crash(), Err(KitError::Invalid(_))));
    let t = Instant::now();
    cluster.start_again()?;
    eprintln!(
        "start_again after crash (crash recovery): {:?}",
        t.elapsed()
    );
    assert_eq!(cluster.sql("SELECT x FROM t")?, "7");
    assert!(matches!(cluster.start_again(), Err(KitError::Invalid(_))));

    cluster.stop()?;
    cluster.start_again()?;
    cluster.create_database("other \"db\"")?;
    assert_eq!(
        cluster.sql("SELECT count(*) FROM pg_database WHERE datname = 'other \"db\"'")?,
        "1"
    );

    let data_dir = cluster.data_dir();
    assert!(data_dir.join("PG_VERSION").is_file());
    drop(cluster);
    assert!(!data_dir.exists(), "Drop removes the temporary directory");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    Ok(())
}

#[tokio::test]
async fn admin_helpers_work_inside_a_tokio_runtime() -> Result<(), KitError> {
    let cluster = Cluster::start()?;
    let conn = format!("{} application_name=holder", cluster.conn_string());
    let holder = connect(&conn).await;
    let pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")
        .get(0);
    let keys = [i64::MIN, -5, 0, 42, i64::MAX];
    for key in keys {
        holder
            .execute("SELECT pg_advisory_lock($1)", &[&key])
            .await
            .expect("lock");
    }
    let mut held = cluster.held_advisory_keys()?;
    held.sort();
    assert_eq!(held, keys.map(|k| (k, pid)));
    assert_eq!(cluster.backends_by_application_name("holder")?, vec![pid]);
    assert_eq!(
        cluster.backends_by_application_name("nobody")?,
        Vec::<i32>::new()
    );

    assert_eq!(cluster.terminate_by_application_name("holder")?, 1);
    assert!(
        cluster.held_advisory_keys()?.is_empty(),
        "terminate waits for exit"
    );
    assert!(holder.simple_query("SELECT 1").await.is_err());

    let other = connect(&cluster.conn_string()).await;
    let other_pid: i32 = other
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")
        .get(0);
    assert!(cluster.terminate_backend(other_pid)?);
    assert!(!cluster.terminate_backend(other_pid)?);
    assert!(other.simple_query("SELECT 1").await.is_err());
    Ok(())
}

#[tokio::test]
async fn proxy_pass_blackhole_latency_reset() -> Result<(), KitError> {
    let cluster = Cluster::start()?;
    let refused = FaultProxy::start("192.0.2.1:5432".parse().expect("addr"));
    assert!(matches!(refused, Err(KitError::Invalid(_))));

    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], cluster.port())))?;
    assert_eq!(proxy.addr().port(), proxy.port());
    let conn = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        proxy.port()
    );
    let client = connect(&conn).await;
    let t = Instant::now();
    assert_eq!(select(&client, 1).await, 1);
    let pass = t.elapsed();
    assert_eq!(proxy.connections(), 1);
    assert_eq!(proxy.open_connections(), 1);

    // Black hole: the query is sent but neither it nor any answer gets through.
    proxy.set_mode(Mode::BlackHole);
    let sent = Instant::now();
    let query = tokio::spawn(async move {
        let n = select(&client, 2).await;
        (client, n, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!query.is_finished(), "query got through a black hole");
    let partitioned = tokio::time::timeout(
        Duration::from_millis(300),
        tokio_postgres::connect(&conn, NoTls),
    )
    .await;
    assert!(
        partitioned.is_err(),
        "new connection got through a black hole"
    );
    let healed = Instant::now();
    proxy.set_mode(Mode::Pass);
    let (client, n, done) = tokio::time::timeout(Duration::from_secs(5), query)
        .await
        .expect("query resumes after Pass")
        .expect("query task");
    assert_eq!(n, 2);
    eprintln!(
        "black hole: query answered {:?} after it was sent, {:?} after Pass (plain query: {pass:?})",
        done - sent,
        done - healed
    );

    proxy.set_mode(Mode::Latency(Duration::from_millis(50)));
    let t = Instant::now();
    client.simple_query("SELECT 3").await.expect("query");
    let slow = t.elapsed();
    eprintln!("latency 50 ms each way: one round trip took {slow:?}");
    assert!(slow >= Duration::from_millis(100), "{slow:?}");
    proxy.set_mode(Mode::Pass);
    assert_eq!(select(&client, 4).await, 4);

    proxy.set_mode(Mode::Reset);
    let err = client
        .simple_query("SELECT 5")
        .await
        .expect_err("reset connection");
    eprintln!("after reset the client sees: {err}");
    let fresh = connect(&conn).await;
    assert_eq!(select(&fresh, 6).await, 6);
    assert_eq!(proxy.connections(), 3);
    Ok(())
}

#[test]
fn proxy_reset_sends_rst_to_both_sides() -> Result<(), KitError> {
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let proxy = FaultProxy::start(upstream.local_addr().expect("addr"))?;
    let mut client = TcpStream::connect(proxy.addr()).expect("connect");
    client.write_all(b"ping").expect("write");
    let (mut server, _) = upstream.accept().expect("accept");
    let mut buf = [0; 4];
    server.read_exact(&mut buf).expect("read");
    assert_eq!(&buf, b"ping");

    // A black hole holds bytes without closing anything, then lets them through.
    proxy.set_mode(Mode::BlackHole);
    server.write_all(b"pong").expect("write");
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    assert!(client.read(&mut buf).is_err(), "bytes crossed a black hole");
    proxy.set_mode(Mode::Pass);
    client.read_exact(&mut buf).expect("read after Pass");
    assert_eq!(&buf, b"pong");

    proxy.set_mode(Mode::Reset);
    for (side, stream) in [("client", &mut client), ("server", &mut server)] {
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let err = stream.read(&mut buf).expect_err("reset");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{side}: {err}");
    }
    Ok(())
}

#[test]
fn replica_lines_and_signals() -> Result<(), KitError> {
    let before = monotonic_nanos();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo hi; echo warn >&2; exec sleep 30"]);
    let mut replica = Replica::spawn(cmd)?;
    let pid = replica.pid();
    let (at, line) = replica.wait_for_line(|l| l == "hi", Duration::from_secs(5))?;
    assert_eq!(line, "hi");
    assert!(at.elapsed() < Duration::from_secs(5));
    replica.wait_for_line(|l| l == "warn", Duration::from_secs(5))?;
    let lines = replica.lines();
    let warn = lines.iter().find(|l| l.text == "warn").expect("warn line");
    assert_eq!(warn.stream, Stream::Stderr);
    assert!(before <= warn.mono_nanos && warn.mono_nanos <= monotonic_nanos());

    let t = Instant::now();
    let err = replica
        .wait_for_line(|l| l == "never", Duration::from_millis(200))
        .expect_err("no such line")
        .to_string();
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert!(err.contains("hi") && err.contains("warn"), "{err}");

    assert!(pid_alive(pid));
    replica.sigstop()?;
    let wait_state = |want: char| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while proc_state(pid) != want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        proc_state(pid)
    };
    assert_eq!(wait_state('T'), 'T');
    assert!(replica.is_alive() && pid_alive(pid));
    replica.sigcont()?;
    assert_eq!(wait_state('S'), 'S');
    replica.kill9()?;
    let status = replica.wait_exit(Duration::from_secs(5))?;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(!replica.is_alive() && !pid_alive(pid));

    // A stateful predicate sees each line once, in order: pick the third tick.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "for i in 1 2 3 4; do echo tick $i; done"]);
    let mut ticker = Replica::spawn(cmd)?;
    let mut seen = 0;
    let (_, third) = ticker.wait_for_line(
        |l| {
            l.starts_with("tick") && {
                seen += 1;
                seen == 3
            }
        },
        Duration::from_secs(5),
    )?;
    assert_eq!(third, "tick 3");
    assert!(ticker.wait_exit(Duration::from_secs(5))?.success());
    let t = Instant::now();
    let ended = ticker.wait_for_line(|l| l == "never", Duration::from_secs(10));
    assert!(matches!(ended, Err(KitError::Failed { .. })));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "fails once output ends"
    );
    assert!(pid_alive(std::process::id() as i32));
    Ok(())
}

#[test]
fn pgbouncer_transaction_and_session_mode() -> Result<(), KitError> {
    let cluster = Cluster::start()?;
    for (mode, name) in [
        (PoolMode::Transaction, "transaction"),
        (PoolMode::Session, "session"),
    ] {
        let t = Instant::now();
        let bouncer = PgBouncer::start(&cluster, mode)?;
        eprintln!("PgBouncer::start ({name}): {:?}", t.elapsed());
        assert_eq!(
            bouncer.url(),
            format!("postgres://postgres@127.0.0.1:{}/postgres", bouncer.port())
        );
        let psql = |db: &str, query: &str| {
            let out = Command::new(cluster.psql())
                .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
                .args([
                    "-p",
                    &bouncer.port().to_string(),
                    "-U",
                    "postgres",
                    "-d",
                    db,
                ])
                .args(["-c", query])
                .output()
                .expect("run psql");
            assert!(out.status.success(), "{out:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        assert_eq!(psql("postgres", "SELECT 1"), "1");
        let config = psql("pgbouncer", "SHOW CONFIG");
        let wanted = format!("pool_mode|{name}|");
        assert!(config.lines().any(|l| l.starts_with(&wanted)), "{config}");
    }
    Ok(())
}

/// With `LEASE_PG_BINDIR` set (as `.ci/run` does for every version but the default), the
/// cluster and its standby are that directory's server, whatever `psql` the kit uses.
#[test]
fn cluster_runs_the_server_of_its_bindir() -> Result<(), KitError> {
    let primary = Cluster::start()?;
    if let Some(dir) = std::env::var_os(lease_tests::cluster::BINDIR_VAR) {
        assert_eq!(primary.bindir(), std::path::Path::new(&dir));
    }
    let out = Command::new(primary.bindir().join("postgres"))
        .arg("--version")
        .output()
        .expect("postgres --version");
    // "postgres (PostgreSQL) 17.10", "postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"
    let binary = String::from_utf8_lossy(&out.stdout);
    let binary = binary.split_whitespace().nth(2).unwrap_or_default();
    let standby = primary.start_standby()?;
    for cluster in [&primary, &standby] {
        assert_eq!(
            cluster.sql("SHOW server_version")?.split(' ').next(),
            Some(binary)
        );
    }
    eprintln!("server {binary}, psql {}", primary.psql().display());
    Ok(())
}

#[test]
fn standby_is_in_recovery() -> Result<(), KitError> {
    let primary = Cluster::start()?;
    let t = Instant::now();
    let standby = primary.start_standby()?;
    eprintln!("start_standby: {:?}", t.elapsed());
    assert_ne!(standby.port(), primary.port());
    assert_eq!(standby.sql("SELECT pg_is_in_recovery()")?, "t");
    assert_eq!(primary.sql("SELECT pg_is_in_recovery()")?, "f");
    assert!(standby.sql("CREATE TABLE nope (x int)").is_err());
    Ok(())
}

#[test]
fn stopped_standby_lags_and_is_promoted() -> Result<(), KitError> {
    let mut primary = Cluster::start()?;
    let mut standby = primary.start_standby()?;
    primary.sql("CREATE TABLE seen (x int); INSERT INTO seen VALUES (1)")?;
    let lsn = primary.sql("SELECT pg_current_wal_insert_lsn()")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while standby.sql(&format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'"))? != "t" {
        assert!(Instant::now() < deadline, "the standby did not catch up");
        std::thread::sleep(Duration::from_millis(20));
    }
    standby.stop()?;
    primary.sql("INSERT INTO seen VALUES (2)")?;
    primary.stop()?;
    standby.start_again()?;
    assert_eq!(standby.sql("SELECT pg_is_in_recovery()")?, "t");
    let t = Instant::now();
    standby.promote()?;
    eprintln!("promote: {:?}", t.elapsed());
    assert_eq!(standby.sql("SELECT pg_is_in_recovery()")?, "f");
    assert_eq!(
        standby.sql("SELECT string_agg(x::text, ',') FROM seen")?,
        "1"
    );
    standby.sql("INSERT INTO seen VALUES (3)")?;
    Ok(())
}

/// `SELECT 1` by `psql` run inside `ns` against `cluster` on the veth address, with a
/// 2 s connect timeout: whether it worked.
fn psql_from_netns(ns: &lease_tests::NetNs, cluster: &Cluster) -> bool {
    ns.command(cluster.psql())
        .args(["-X", "-A", "-t", "-c", "SELECT 1"])
        .args([
            "-h",
            &ns.host_addr().to_string(),
            "-p",
            &cluster.port().to_string(),
        ])
        .args(["-U", "postgres", "-d", "postgres"])
        .env("PGCONNECT_TIMEOUT", "2")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "1")
}

#[test]
fn netns_reaches_the_cluster_until_partitioned() -> Result<(), KitError> {
    let mut ns = lease_tests::NetNs::create()?;
    let name = ns.name().to_owned();
    assert_ne!(ns.host_addr(), ns.ns_addr());
    let cluster = Cluster::start_listening(ns.host_addr(), &ns.network())?;
    assert!(
        psql_from_netns(&ns, &cluster),
        "no connection from the netns"
    );
    ns.partition()?;
    assert!(ns.is_partitioned());
    let t = Instant::now();
    assert!(!psql_from_netns(&ns, &cluster), "connected through the cut");
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    ns.heal()?;
    assert!(
        psql_from_netns(&ns, &cluster),
        "no connection after healing"
    );
    ns.partition()?;
    drop(ns);
    let list = Command::new("ip").args(["netns", "list"]).output();
    let list = String::from_utf8_lossy(&list.map(|o| o.stdout).unwrap_or_default()).into_owned();
    assert!(
        !list
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name.as_str())),
        "{list}"
    );
    let rules = Command::new("iptables").arg("-S").output();
    let rules = String::from_utf8_lossy(&rules.map(|o| o.stdout).unwrap_or_default()).into_owned();
    assert!(!rules.contains(&name), "rules left behind:\n{rules}");
    Ok(())
}

/// The statement prefixes the scenarios look for in `pg_stat_activity` are those of the
/// statements the core sends.
#[test]
fn statement_prefixes_match_the_core() {
    use lease_proto::Statement;
    use lease_tests::scenario::{TRY_PREFIX, WAIT_PREFIX};
    let try_lock = Statement::TryLock {
        keys: vec![1, 2],
        backend_pid: 3,
        nonce: 4,
    };
    assert!(try_lock.sql().starts_with(TRY_PREFIX), "{}", try_lock.sql());
    let wait = Statement::Wait {
        key: 1,
        timeout_ms: 5,
        crowd: Some(2),
        watch_of: None,
    };
    assert!(wait.sql().starts_with(WAIT_PREFIX), "{}", wait.sql());
    let take = Statement::Take {
        key: 1,
        timeout_ms: 5,
        crowd: Some(2),
        backend_pid: 3,
        nonce: 4,
    };
    assert!(take.sql().starts_with(WAIT_PREFIX), "{}", take.sql());
}
