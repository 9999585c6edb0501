//! Ephemeral PostgreSQL clusters.

use crate::process::{children, pid_alive, signal, stat};
use crate::{
    bind_conflict, command_as, file_tail, free_port, io_err, poll, port_open, run, run_as,
    KitError, RunAs, TempDir, BIND_ATTEMPTS,
};
use std::env;
use std::fs::{self, File};
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

/// Settings appended to `postgresql.conf`: fast and unsafe, for throw-away clusters.
/// The port and the socket directory are passed on the command line instead, so that a
/// standby copied from this data directory can get its own.
const CONFIG: &str = "
# lease-tests
listen_addresses = '127.0.0.1'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
shared_buffers = 32MB
# A standby's base backup streams the WAL written meanwhile: keep it, so that a checkpoint
# cannot remove a segment first (pg_basebackup failed with `requested WAL segment
# 000000010000000000000002 has already been removed` once, in CI's whole-suite run).
wal_keep_size = 128MB
logging_collector = off
log_line_prefix = '%m [%p] %q%a '
";

/// How long a server may take to start, including crash recovery.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long admin commands (`psql`, `initdb`, `pg_basebackup`) may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// A throw-away PostgreSQL server in its own temporary directory, on a random loopback port.
///
/// Superuser `postgres`, trust authentication, TCP on 127.0.0.1 only (plus a private unix
/// socket directory, and the address given to [`Cluster::start_listening`]). Dropping it stops the server (immediate mode) and deletes everything.
/// When the tests run as root, the server runs as [`crate::UNPRIVILEGED_USER`].
pub struct Cluster {
    dir: TempDir,
    bindir: PathBuf,
    /// Where `psql` (and `pg_basebackup`, if any) are: `bindir` when it has them, else the
    /// system's client programs (the npm server builds of `LEASE_PG_BINDIR` have none).
    clients: PathBuf,
    user: Option<RunAs>,
    port: u16,
    postmaster: Option<Child>,
}

impl Cluster {
    /// Creates a new cluster with `initdb` and starts it.
    pub fn start() -> Result<Cluster, KitError> {
        Cluster::start_with("", "")
    }

    /// Like [`Cluster::start`], but listening on `addr` too (same port, besides 127.0.0.1)
    /// and trusting connections from the network `clients` (CIDR, e.g. a
    /// [`crate::NetNs::network`]). `addr` must exist on an interface of this namespace.
    pub fn start_listening(addr: Ipv4Addr, clients: &str) -> Result<Cluster, KitError> {
        Cluster::start_with(
            &format!("listen_addresses = '127.0.0.1,{addr}'\n"),
            &format!("host all all {clients} trust\n"),
        )
    }

    /// Like [`Cluster::start`], with TLS (`ssl = on`, the server certificate and key of
    /// `certs`, its CA for client certificates) and `hba` as the whole `pg_hba.conf`
    /// (e.g. `hostssl` lines only, `cert` authentication). The kit's own `psql` connects
    /// over TCP with libpq's `sslmode=prefer`, so `hostssl ... postgres ... trust` must be
    /// among the lines for [`Cluster::sql`] to work.
    pub fn start_tls(certs: &crate::Certs, hba: &str) -> Result<Cluster, KitError> {
        Cluster::start_inner(
            "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'ca.crt'\n",
            hba,
            Some(certs),
        )
    }

    /// Like [`Cluster::start`], but TCP connections of every role except
    /// `postgres` authenticate with a `scram-sha-256` password (`postgres`
    /// stays trusted, so [`Cluster::sql`] works). Create roles with
    /// `CREATE ROLE name LOGIN PASSWORD '...'` through [`Cluster::sql`].
    pub fn start_password_auth() -> Result<Cluster, KitError> {
        let cluster = Cluster::start()?;
        let path = cluster.data_dir().join("pg_hba.conf");
        std::fs::write(
            &path,
            "local all all trust\n\
             host all postgres 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 scram-sha-256\n",
        )
        .map_err(io_err(format!("writing {}", path.display())))?;
        cluster.sql("SELECT pg_reload_conf()")?;
        // The postmaster rereads pg_hba.conf on the signal, asynchronously.
        std::thread::sleep(Duration::from_millis(300));
        Ok(cluster)
    }

    /// Creates and starts a cluster with `conf` appended to `postgresql.conf` (after
    /// [`CONFIG`]) and `hba` to `pg_hba.conf`.
    fn start_with(conf: &str, hba: &str) -> Result<Cluster, KitError> {
        Cluster::start_inner(conf, hba, None)
    }

    /// [`Cluster::start_with`]; with `certs`, their server files are copied into the data
    /// directory and `hba` replaces `pg_hba.conf` instead of extending it.
    fn start_inner(
        conf: &str,
        hba: &str,
        certs: Option<&crate::Certs>,
    ) -> Result<Cluster, KitError> {
        Cluster::start_in(find_bindir()?, conf, hba, certs)
    }

    /// Like [`Cluster::start`], with the server of PostgreSQL major version `major` as
    /// `.ci/install-deps` fetches it ([`fetched_bindir`]), whatever [`BINDIR_VAR`] says: for
    /// tests of one version (e.g. that PostgreSQL 13 is refused).
    pub fn start_version(major: u32) -> Result<Cluster, KitError> {
        Cluster::start_in(fetched_bindir(major)?, "", "", None)
    }

    fn start_in(
        bindir: PathBuf,
        conf: &str,
        hba: &str,
        certs: Option<&crate::Certs>,
    ) -> Result<Cluster, KitError> {
        let clients = find_clients(&bindir)?;
        let user = run_as()?;
        let (dir, data) = init_data(&bindir, user, "lease-pg")?;
        for (file, text) in [
            ("postgresql.conf", format!("{CONFIG}{conf}")),
            ("pg_hba.conf", hba.to_owned()),
        ] {
            let path = data.join(file);
            File::options()
                .append(certs.is_none() || file != "pg_hba.conf")
                .write(true)
                .truncate(certs.is_some() && file == "pg_hba.conf")
                .open(&path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .map_err(io_err(format!("writing settings to {}", path.display())))?;
        }
        if let Some(certs) = certs {
            for (from, to, mode) in [
                (&certs.server_cert, "server.crt", 0o644),
                (&certs.server_key, "server.key", 0o600),
                (&certs.ca, "ca.crt", 0o644),
            ] {
                let path = data.join(to);
                let text = fs::read_to_string(from)
                    .map_err(io_err(format!("reading {}", from.display())))?;
                crate::tls::write(&path, &text, mode)?;
                if let Some(o) = user {
                    std::os::unix::fs::chown(&path, Some(o.uid), Some(o.gid))
                        .map_err(io_err(format!("chown {}", path.display())))?;
                }
            }
        }
        Cluster::launch_in(dir, bindir, clients, user)
    }

    /// Starts a hot standby of this cluster (`pg_basebackup -R` into a new temporary
    /// directory, own port), waiting until it accepts read-only connections. Without a
    /// `pg_basebackup` of the server's own version (the npm server builds have none, and an
    /// older one refuses a newer server), the kit copies the data directory itself between
    /// `pg_backup_start` and `pg_backup_stop`, as PostgreSQL's low-level backup API allows.
    pub fn start_standby(&self) -> Result<Cluster, KitError> {
        let dir = TempDir::new("lease-pg-standby", self.user)?;
        dir.subdir("sock", self.user)?;
        let data = dir.path().join("data");
        if self.bindir.join("pg_basebackup").is_file() {
            run(
                command_as(&self.bindir.join("pg_basebackup"), self.user, dir.path())
                    .args([
                        "-h",
                        self.host(),
                        "-p",
                        &self.port.to_string(),
                        "-U",
                        "postgres",
                    ])
                    .arg("-D")
                    .arg(&data)
                    .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]),
                "pg_basebackup",
                COMMAND_TIMEOUT,
            )?;
        } else {
            self.copy_for_standby(dir.path(), &data)?;
        }
        Cluster::launch_in(dir, self.bindir.clone(), self.clients.clone(), self.user)
    }

    /// A base backup of this running cluster into `data`, set up as a streaming standby of
    /// it, without `pg_basebackup`: a non-exclusive low-level backup on one admin session
    /// (`pg_start_backup`/`pg_stop_backup` before PostgreSQL 15), the files copied with
    /// `cp -a` as the server's user, then the WAL written meanwhile, the backup label, and
    /// what `pg_basebackup -R` writes (`standby.signal`, `primary_conninfo`).
    fn copy_for_standby(&self, home: &Path, data: &Path) -> Result<(), KitError> {
        // On a thread of its own: the admin connection blocks on a runtime of its own,
        // which must not be entered from an async test's runtime thread.
        std::thread::scope(|s| {
            s.spawn(|| self.copy_for_standby_blocking(home, data))
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    fn copy_for_standby_blocking(&self, home: &Path, data: &Path) -> Result<(), KitError> {
        let admin = crate::scenario::Admin::connect(&self.conn_string())?;
        let value = |sql: &str| -> Result<Option<String>, KitError> {
            Ok(admin
                .rows(sql)?
                .into_iter()
                .next()
                .and_then(|r| r.into_iter().next().flatten()))
        };
        let version: i64 = value("SHOW server_version_num")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let (start, stop) = if version >= 150_000 {
            (
                "SELECT pg_backup_start('lease-tests standby', true)",
                "SELECT labelfile FROM pg_backup_stop(false)",
            )
        } else {
            (
                "SELECT pg_start_backup('lease-tests standby', true, false)",
                "SELECT labelfile FROM pg_stop_backup(false, false)",
            )
        };
        admin.rows(start)?;
        let copy = |from: PathBuf, to: &Path| {
            run(
                command_as(Path::new("cp"), self.user, home)
                    .arg("-a")
                    .arg(from)
                    .arg(to),
                "cp -a (standby base backup)",
                COMMAND_TIMEOUT,
            )
            .map(drop)
            .or_else(|e| match e {
                // A file the server removed during the copy (a temporary file, a
                // recycled WAL segment): the backup does not need it, as with
                // pg_basebackup.
                KitError::Failed { ref detail, .. }
                    if detail.contains("No such file or directory")
                        && detail.lines().all(|l| {
                            l.trim().is_empty() || l.contains("No such file or directory")
                        }) =>
                {
                    Ok(())
                }
                e => Err(e),
            })
        };
        let copied = copy(self.data_dir(), data);
        let label = value(stop)?;
        copied?;
        copy(self.data_dir().join("pg_wal/."), &data.join("pg_wal"))?;
        let label = label.ok_or_else(|| KitError::Failed {
            context: "pg_backup_stop returned no backup label".into(),
            detail: String::new(),
        })?;
        for gone in ["postmaster.pid", "postmaster.opts"] {
            let _ = fs::remove_file(data.join(gone));
        }
        let conninfo = format!(
            "\nprimary_conninfo = 'host={} port={} user=postgres'\n",
            self.host(),
            self.port
        );
        let auto_conf = fs::read_to_string(data.join("postgresql.auto.conf")).unwrap_or_default();
        for (file, text) in [
            ("backup_label", label),
            ("standby.signal", String::new()),
            ("postgresql.auto.conf", format!("{auto_conf}{conninfo}")),
        ] {
            let path = data.join(file);
            crate::tls::write(&path, &text, 0o600)?;
            if let Some(o) = self.user {
                std::os::unix::fs::chown(&path, Some(o.uid), Some(o.gid))
                    .map_err(io_err(format!("chown {}", path.display())))?;
            }
        }
        Ok(())
    }

    /// The TCP port, on [`Cluster::host`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Always `"127.0.0.1"`.
    pub fn host(&self) -> &'static str {
        "127.0.0.1"
    }

    /// The directory holding the server's unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@{}:{}/{db}", self.host(), self.port)
    }

    /// `host=127.0.0.1 port=PORT user=postgres dbname=postgres`.
    pub fn conn_string(&self) -> String {
        format!(
            "host={} port={} user=postgres dbname=postgres",
            self.host(),
            self.port
        )
    }

    /// The directory of the PostgreSQL server binaries in use (`LEASE_PG_BINDIR` if set).
    pub fn bindir(&self) -> &Path {
        &self.bindir
    }

    /// The `psql` the kit uses: the server's own, else the system's (any `psql` from 14 on
    /// talks to servers 13 to 18).
    pub fn psql(&self) -> PathBuf {
        self.clients.join("psql")
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server log (stdout and stderr of the postmaster, appended across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// Stops the server (fast mode: sessions are terminated, then a checkpoint) and starts it
    /// again on the same port.
    pub fn restart(&mut self) -> Result<(), KitError> {
        self.shutdown(libc::SIGINT)?;
        self.launch()
    }

    /// Stops the server in immediate mode, like `pg_ctl stop -m immediate` (no checkpoint,
    /// WAL not yet written is lost; the next start runs recovery). On a standby this pauses
    /// replication: after [`Cluster::start_again`] it catches up if its primary is reachable,
    /// and otherwise stays behind (and can then be [promoted](Cluster::promote)).
    pub fn stop(&mut self) -> Result<(), KitError> {
        self.shutdown(libc::SIGQUIT)
    }

    /// Stops the server in fast mode, like `pg_ctl stop -m fast` (every session is
    /// terminated, then the shutdown checkpoint; a streaming standby receives all of it: a
    /// clean switchover's first step). Use [`Cluster::start_again`] to start it again.
    pub fn stop_fast(&mut self) -> Result<(), KitError> {
        self.shutdown(libc::SIGINT)
    }

    /// Kills the postmaster and all its children with SIGKILL, like a machine crash, and
    /// waits until they are gone and the port is closed. Use [`Cluster::start_again`] next.
    ///
    /// As `synchronous_commit = off`, transactions committed in the last few hundred
    /// milliseconds may be lost, as on a real crash (`SET synchronous_commit = on` first
    /// where that matters).
    pub fn crash(&mut self) -> Result<(), KitError> {
        let Some(mut postmaster) = self.postmaster.take() else {
            return Err(KitError::Invalid("crash: the server is not running".into()));
        };
        let pid = postmaster.id() as i32;
        // Freeze the postmaster first so that it cannot fork while its children are listed.
        let _ = signal(pid, libc::SIGSTOP);
        poll(Duration::from_secs(5), || {
            Ok(matches!(stat(pid), None | Some(('T' | 'Z', _))).then_some(()))
        })?;
        let kids = children(pid);
        let _ = signal(pid, libc::SIGKILL);
        for &kid in &kids {
            let _ = signal(kid, libc::SIGKILL);
        }
        postmaster
            .wait()
            .map_err(io_err("reaping the killed postmaster"))?;
        let gone = poll(Duration::from_secs(10), || {
            Ok((!kids.iter().any(|&k| pid_alive(k)) && !port_open(self.port)).then_some(()))
        })?;
        gone.ok_or_else(|| KitError::Timeout {
            context: format!(
                "the killed server's processes {kids:?} or port {} are still alive",
                self.port
            ),
            detail: file_tail(&self.log_path(), 20),
        })
    }

    /// Starts the server again after [`Cluster::crash`] or [`Cluster::stop`], on the same
    /// port; after a crash PostgreSQL runs crash recovery first.
    pub fn start_again(&mut self) -> Result<(), KitError> {
        if self.postmaster.is_some() {
            return Err(KitError::Invalid(
                "start_again: the server is already running".into(),
            ));
        }
        // After a crash the lock file names a dead postmaster; drop it so that a recycled
        // pid cannot make the new postmaster think the old one still runs.
        let _ = fs::remove_file(self.data_dir().join("postmaster.pid"));
        self.launch()
    }

    /// Promotes this hot standby to a primary (`pg_promote`), waiting until it accepts
    /// writes. It then no longer follows its old primary and starts a new timeline.
    pub fn promote(&self) -> Result<(), KitError> {
        let promoted = self.sql("SELECT pg_promote(true, 60)")?;
        let in_recovery = self.sql("SELECT pg_is_in_recovery()")?;
        if promoted != "t" || in_recovery != "f" {
            return Err(KitError::Failed {
                context: format!(
                    "pg_promote returned {promoted:?}, pg_is_in_recovery {in_recovery:?}"
                ),
                detail: file_tail(&self.log_path(), 20),
            });
        }
        Ok(())
    }

    /// Stops this server (fast mode) and upgrades its data with `pg_upgrade` (copy mode)
    /// into a new cluster (`initdb` as [`Cluster::start`] does, same binaries: an upgrade
    /// within one major version, which does what a major upgrade does to the WAL: a new
    /// cluster on timeline 1, transaction ids carried over), started on a new port. This
    /// cluster stays stopped.
    pub fn pg_upgrade(&mut self) -> Result<Cluster, KitError> {
        if !self.bindir.join("pg_upgrade").is_file() {
            return Err(KitError::Missing(format!(
                "pg_upgrade not found in {}: the npm server builds of {BINDIR_VAR} have \
                 none; run this test on the system's PostgreSQL (unset {BINDIR_VAR})",
                self.bindir.display()
            )));
        }
        self.shutdown(libc::SIGINT)?;
        let (dir, data) = init_data(&self.bindir, self.user, "lease-pg-upgraded")?;
        let (old_port, new_port) = (free_port()?, free_port()?);
        run(
            command_as(&self.bindir.join("pg_upgrade"), self.user, dir.path())
                .arg("-b")
                .arg(&self.bindir)
                .arg("-B")
                .arg(&self.bindir)
                .arg("-d")
                .arg(self.data_dir())
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-p", &old_port.to_string()])
                .args(["-P", &new_port.to_string(), "-s"])
                .arg(dir.path().join("sock"))
                .arg("--no-sync"),
            "pg_upgrade",
            COMMAND_TIMEOUT,
        )?;
        let conf = data.join("postgresql.conf");
        File::options()
            .append(true)
            .open(&conf)
            .and_then(|mut f| f.write_all(CONFIG.as_bytes()))
            .map_err(io_err(format!("writing settings to {}", conf.display())))?;
        Cluster::launch_in(dir, self.bindir.clone(), self.clients.clone(), self.user)
    }

    /// Freezes the server: SIGSTOP to the postmaster, then to each of its children (the
    /// postmaster first, so it cannot fork while they are listed), waiting until every one
    /// is stopped. Connections stay open (the kernel still accepts and acknowledges) but
    /// nothing answers, as on a paused VM or a hung host. The server resumes (SIGCONT, to
    /// the same processes) when the returned guard is dropped, also on a panic.
    pub fn freeze(&self) -> Result<Frozen, KitError> {
        let Some(postmaster) = &self.postmaster else {
            return Err(KitError::Invalid(
                "freeze: the server is not running".into(),
            ));
        };
        let pid = postmaster.id() as i32;
        let mut frozen = Frozen { pids: vec![pid] };
        signal(pid, libc::SIGSTOP).map_err(io_err("SIGSTOP to the postmaster"))?;
        let stopped = |pid: i32| matches!(stat(pid), None | Some(('T' | 't' | 'Z', _)));
        poll(Duration::from_secs(5), || Ok(stopped(pid).then_some(())))?;
        for kid in children(pid) {
            if signal(kid, libc::SIGSTOP).is_ok() {
                frozen.pids.push(kid);
            }
        }
        let all = poll(Duration::from_secs(5), || {
            Ok(frozen.pids.iter().all(|&p| stopped(p)).then_some(()))
        })?;
        all.ok_or_else(|| KitError::Timeout {
            context: format!("the server's processes {:?} did not all stop", frozen.pids),
            detail: String::new(),
        })?;
        Ok(frozen)
    }

    /// Runs `query` with `psql` as `postgres` in database `postgres` over TCP and returns
    /// its trimmed unaligned, tuples-only output (`|` between columns, one row a line).
    pub fn sql(&self, query: &str) -> Result<String, KitError> {
        run(
            Command::new(self.psql())
                .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
                .args(["-h", self.host(), "-p", &self.port.to_string()])
                .args(["-U", "postgres", "-d", "postgres", "-c", query])
                .env("PGCONNECT_TIMEOUT", "10")
                .env("PGAPPNAME", "lease-tests-admin"),
            &format!("psql -c {query:?}"),
            COMMAND_TIMEOUT,
        )
    }

    /// Granted advisory locks taken with a single `bigint` key: `(key, backend pid)`.
    pub fn held_advisory_keys(&self) -> Result<Vec<(i64, i32)>, KitError> {
        let out = self.sql(&format!(
            "SELECT {}, pid FROM pg_locks \
             WHERE locktype = 'advisory' AND objsubid = 1 AND granted",
            lease_proto::server::ADVISORY_KEY_SQL
        ))?;
        out.lines()
            .map(|line| {
                let parsed = line
                    .split_once('|')
                    .and_then(|(k, p)| Some((k.parse().ok()?, p.parse().ok()?)));
                parsed.ok_or_else(|| KitError::Failed {
                    context: "unexpected row from pg_locks".into(),
                    detail: line.to_owned(),
                })
            })
            .collect()
    }

    /// Terminates backend `pid` and waits (up to 5 s) until it is gone, so that its locks
    /// are released. Returns whether it was terminated.
    pub fn terminate_backend(&self, pid: i32) -> Result<bool, KitError> {
        Ok(self.sql(&format!("SELECT pg_terminate_backend({pid}, 5000)"))? == "t")
    }

    /// Terminates every backend whose `application_name` is `name` (waiting for each, up to
    /// 5 s) and returns how many were terminated.
    pub fn terminate_by_application_name(&self, name: &str) -> Result<usize, KitError> {
        let out = self.sql(&format!(
            "WITH victims AS MATERIALIZED ({}) \
             SELECT count(*) FROM victims WHERE pg_terminate_backend(pid, 5000)",
            backends_query(name)
        ))?;
        out.parse().map_err(|_| KitError::Failed {
            context: "unexpected count from pg_terminate_backend".into(),
            detail: out,
        })
    }

    /// Pids of the backends whose `application_name` is `name`, ascending.
    pub fn backends_by_application_name(&self, name: &str) -> Result<Vec<i32>, KitError> {
        let out = self.sql(&format!("{} ORDER BY pid", backends_query(name)))?;
        out.lines()
            .map(|pid| {
                pid.parse().map_err(|_| KitError::Failed {
                    context: "unexpected pid from pg_stat_activity".into(),
                    detail: pid.to_owned(),
                })
            })
            .collect()
    }

    /// `CREATE DATABASE name`.
    pub fn create_database(&self, name: &str) -> Result<(), KitError> {
        self.sql(&format!(
            "CREATE DATABASE \"{}\"",
            name.replace('"', "\"\"")
        ))
        .map(drop)
    }

    /// The cluster whose data directory `dir` holds (`dir/data`, made ready by the caller),
    /// run by `bindir`'s server as `user` on a free port: started ([`Cluster::launch_new`]).
    fn launch_in(
        dir: TempDir,
        bindir: PathBuf,
        clients: PathBuf,
        user: Option<RunAs>,
    ) -> Result<Cluster, KitError> {
        let mut cluster = Cluster {
            dir,
            bindir,
            clients,
            user,
            port: free_port()?,
            postmaster: None,
        };
        cluster.launch_new()?;
        Ok(cluster)
    }

    /// Spawns the postmaster and waits until it accepts connections.
    /// Starts a new cluster's server ([`Cluster::launch`]), on another free port when its
    /// port was taken between the pick and the bind (each attempt's own log lines decide).
    fn launch_new(&mut self) -> Result<(), KitError> {
        let mut attempt = 1;
        loop {
            let logged = fs::metadata(self.log_path()).map_or(0, |m| m.len());
            match self.launch() {
                Err(e) if attempt < BIND_ATTEMPTS && self.bind_conflict_since(logged, &e) => {
                    attempt += 1;
                    self.port = free_port()?;
                }
                done => return done,
            }
        }
    }

    /// Whether the server's log since byte `from` says its port was taken.
    fn bind_conflict_since(&self, from: u64, error: &KitError) -> bool {
        let log = fs::read(self.log_path()).unwrap_or_default();
        let new = log.get(from as usize..).unwrap_or_default();
        bind_conflict(error) && String::from_utf8_lossy(new).contains("Address already in use")
    }

    fn launch(&mut self) -> Result<(), KitError> {
        let log_path = self.log_path();
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io_err(format!("opening {}", log_path.display())))?;
        let stderr = log
            .try_clone()
            .map_err(io_err("duplicating the log file handle"))?;
        let postgres = self.bindir.join("postgres");
        let child = command_as(&postgres, self.user, self.dir.path())
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.socket_dir())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(io_err(format!("spawning {}", postgres.display())))?;
        let pid = child.id().to_string();
        let pidfile = self.data_dir().join("postmaster.pid");
        let postmaster = self.postmaster.insert(child);
        // Like `pg_ctl -w`: line 1 of postmaster.pid is the pid, line 8 the status.
        let ready = poll(START_TIMEOUT, || {
            if let Some(status) = postmaster
                .try_wait()
                .map_err(io_err("waiting for postgres"))?
            {
                return Err(KitError::Failed {
                    context: format!("postgres exited during startup ({status})"),
                    detail: String::new(),
                });
            }
            let text = fs::read_to_string(&pidfile).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let status = lines.get(7).map(|s| s.trim());
            Ok((lines.first() == Some(&pid.as_str())
                && matches!(status, Some("ready" | "standby")))
            .then_some(()))
        });
        match ready {
            Ok(Some(())) => Ok(()),
            failed => {
                if let Some(mut child) = self.postmaster.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                let detail = file_tail(&log_path, 30);
                Err(match failed {
                    Err(KitError::Failed { context, .. }) => KitError::Failed { context, detail },
                    Err(e) => e,
                    Ok(_) => KitError::Timeout {
                        context: format!("postgres did not become ready within {START_TIMEOUT:?}"),
                        detail,
                    },
                })
            }
        }
    }

    /// A killed postmaster leaves its small System V shared memory segment behind (a new
    /// postmaster on the same port would reuse it): remove it. Its id is on line 7 of the
    /// lock file, which exists when the server is down only after a crash.
    fn remove_crashed_shmem(&self) {
        let Ok(lockfile) = fs::read_to_string(self.data_dir().join("postmaster.pid")) else {
            return;
        };
        let id = lockfile
            .lines()
            .nth(6)
            .and_then(|l| l.split_whitespace().nth(1));
        if let Some(id) = id.and_then(|id| id.parse().ok()) {
            // SAFETY: IPC_RMID takes no buffer; it only marks the segment of our dead server
            // for removal (it is gone once detached, and nothing is attached any more).
            unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
        }
    }

    /// Sends `sig` to the postmaster (SIGINT = fast, SIGQUIT = immediate shutdown) and
    /// waits for it to exit, falling back to SIGKILL after 30 s.
    fn shutdown(&mut self, sig: libc::c_int) -> Result<(), KitError> {
        let Some(mut postmaster) = self.postmaster.take() else {
            return Ok(());
        };
        let _ = signal(postmaster.id() as i32, sig);
        let exited = poll(Duration::from_secs(30), || {
            postmaster
                .try_wait()
                .map_err(io_err("waiting for postgres to stop"))
        })?;
        if exited.is_none() {
            let _ = postmaster.kill();
            let _ = postmaster.wait();
            return Err(KitError::Timeout {
                context: "postgres did not stop within 30 s; killed it".into(),
                detail: file_tail(&self.log_path(), 20),
            });
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.postmaster.is_some() {
            let _ = self.shutdown(libc::SIGQUIT);
        } else {
            self.remove_crashed_shmem();
        }
    }
}

/// A server frozen by [`Cluster::freeze`]: dropping it resumes every process that was
/// stopped.
#[must_use = "dropping it resumes the server at once"]
pub struct Frozen {
    pids: Vec<i32>,
}

impl Frozen {
    /// The stopped processes: the postmaster first, then its children.
    pub fn pids(&self) -> &[i32] {
        &self.pids
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // Children first, the postmaster last: it must not see children it cannot reach.
        for &pid in self.pids.iter().rev() {
            let _ = signal(pid, libc::SIGCONT);
        }
    }
}

/// `SELECT pid FROM pg_stat_activity` for application `name`, excluding the admin session.
fn backends_query(name: &str) -> String {
    format!(
        "SELECT pid FROM pg_stat_activity WHERE application_name = '{}' \
         AND pid <> pg_backend_pid()",
        name.replace('\'', "''")
    )
}

/// The environment variable naming the directory of the PostgreSQL server binaries to test
/// against (`initdb`, `postgres`), e.g. `/opt/lease-pg/17/bin` as `.ci/install-deps`
/// fetches it. Unset: the system's server (`pg_config --bindir`, `PATH`, the newest
/// `/usr/lib/postgresql/*/bin`).
pub const BINDIR_VAR: &str = "LEASE_PG_BINDIR";

/// Where `.ci/install-deps` puts the server of PostgreSQL major version `major`:
/// `$LEASE_PG_CACHE/<major>/bin`, by default `/opt/lease-pg/<major>/bin`; an error naming
/// the script if it is not there.
pub fn fetched_bindir(major: u32) -> Result<PathBuf, KitError> {
    let cache = env::var_os("LEASE_PG_CACHE")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/opt/lease-pg"), PathBuf::from);
    let dir = cache.join(major.to_string()).join("bin");
    if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
        Ok(dir)
    } else {
        Err(KitError::Missing(format!(
            "PostgreSQL {major} not found in {}: run .ci/install-deps (it fetches every \
             version the tests use)",
            dir.display()
        )))
    }
}

/// Finds the directory holding `initdb` and `postgres`: [`BINDIR_VAR`] if set (an error if it
/// names no directory whose `postgres` runs), else `pg_config --bindir`, then `PATH`, then
/// the newest `/usr/lib/postgresql/*/bin`.
fn find_bindir() -> Result<PathBuf, KitError> {
    if let Some(dir) = env::var_os(BINDIR_VAR).filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        let missing: Vec<&str> = ["initdb", "postgres"]
            .into_iter()
            .filter(|p| !dir.join(p).is_file())
            .collect();
        if !missing.is_empty() {
            return Err(KitError::Missing(format!(
                "{BINDIR_VAR}={} has no {}: point it at the bin directory of a PostgreSQL \
                 server build (.ci/install-deps fetches them into /opt/lease-pg/<major>/bin), \
                 or unset it to use the system's server",
                dir.display(),
                missing.join(" and ")
            )));
        }
        let postgres = dir.join("postgres");
        run(
            Command::new(&postgres).arg("--version"),
            &format!("{} --version ({BINDIR_VAR})", postgres.display()),
            COMMAND_TIMEOUT,
        )
        .map_err(|e| {
            KitError::Missing(format!(
                "{BINDIR_VAR}={}: its postgres does not run ({e}): a build for another \
                 platform, or its libraries (../lib) are missing",
                dir.display()
            ))
        })?;
        return Ok(dir);
    }
    system_dirs()
        .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
        .ok_or_else(|| {
            KitError::Missing(
                "PostgreSQL server binaries (initdb, postgres) not found via `pg_config --bindir`, \
                 PATH or /usr/lib/postgresql/*/bin: install the PostgreSQL server binaries: \
                 apt-get install postgresql (or run .ci/install-deps)"
                    .into(),
            )
        })
}

/// A new temporary directory (`prefix`, owned by `user`) with its socket directory `sock`
/// and a data directory `data` made by `bindir`'s `initdb` as every cluster here is: trust
/// authentication, superuser `postgres`, UTF8, no locale. Returns the directory and the
/// data directory's path.
fn init_data(
    bindir: &Path,
    user: Option<RunAs>,
    prefix: &str,
) -> Result<(TempDir, PathBuf), KitError> {
    let dir = TempDir::new(prefix, user)?;
    dir.subdir("sock", user)?;
    let data = dir.path().join("data");
    run(
        command_as(&bindir.join("initdb"), user, dir.path())
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            .arg("--no-locale"),
        "initdb",
        COMMAND_TIMEOUT,
    )?;
    Ok((dir, data))
}

/// The directory of the client programs for a server in `bindir`: `bindir` itself if it has
/// `psql`, else the first system directory that has one.
fn find_clients(bindir: &Path) -> Result<PathBuf, KitError> {
    std::iter::once(bindir.to_owned())
        .chain(system_dirs())
        .find(|dir| dir.join("psql").is_file())
        .ok_or_else(|| {
            KitError::Missing(format!(
                "psql not found in {} nor via `pg_config --bindir`, PATH or \
                 /usr/lib/postgresql/*/bin: install the PostgreSQL client: \
                 apt-get install postgresql-client (or run .ci/install-deps)",
                bindir.display()
            ))
        })
}

/// Where the system's PostgreSQL programs may be, in order: `pg_config --bindir`, `PATH`,
/// `/usr/lib/postgresql/*/bin` newest first.
fn system_dirs() -> impl Iterator<Item = PathBuf> {
    let pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let path: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect())
        .unwrap_or_default();
    let mut debian: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: Result<Vec<u32>, _> = entry
                .file_name()
                .to_str()?
                .split('.')
                .map(str::parse)
                .collect();
            Some((version.ok()?, entry.path().join("bin")))
        })
        .collect();
    debian.sort();
    pg_config
        .into_iter()
        .chain(path)
        .chain(debian.into_iter().rev().map(|(_, dir)| dir))
}
