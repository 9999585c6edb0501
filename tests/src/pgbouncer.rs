//! pgbouncer in front of a [`Cluster`].

use crate::{
    bind_conflict, command_as, file_tail, free_port, io_err, poll, port_open, run_as, Cluster,
    KitError, TempDir, BIND_ATTEMPTS,
};
use std::env;
use std::fs::{self, File};
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

/// pgbouncer's `pool_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection.
    Session,
    /// A server connection per transaction: session state (such as session-level advisory
    /// locks) does not stick to the client.
    Transaction,
}

/// What [`PgBouncer::start_with`] configures beyond the fixed settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `default_pool_size`: server connections per user and database (default 2).
    pub pool_size: u32,
    /// `ignore_startup_parameters`: startup parameters pgbouncer accepts from clients and
    /// drops (default `extra_float_digits`). Adding `options` makes it accept and silently
    /// drop the `-c name=value` startup settings.
    pub ignore_startup_parameters: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            pool_size: 2,
            ignore_startup_parameters: vec!["extra_float_digits".to_owned()],
        }
    }
}

/// A pgbouncer process on a random port of 127.0.0.1, forwarding to a [`Cluster`].
///
/// Trust authentication for user `postgres` (also its admin user: database `pgbouncer` is
/// the admin console), `max_client_conn = 100`, pool size and ignored startup parameters
/// from [`Settings`] (`default_pool_size = 2` by default); every database name is forwarded
/// to the same name on the cluster. Dropping it kills pgbouncer.
pub struct PgBouncer {
    _dir: TempDir,
    port: u16,
    child: Child,
}

impl PgBouncer {
    /// Starts pgbouncer in front of `cluster` with the default [`Settings`] and waits until
    /// it accepts TCP connections.
    pub fn start(cluster: &Cluster, mode: PoolMode) -> Result<PgBouncer, KitError> {
        PgBouncer::start_with(cluster, mode, &Settings::default())
    }

    /// Starts pgbouncer in front of `cluster` with `settings` and waits until it accepts TCP
    /// connections.
    pub fn start_with(
        cluster: &Cluster,
        mode: PoolMode,
        settings: &Settings,
    ) -> Result<PgBouncer, KitError> {
        let mut attempt = 1;
        loop {
            match Self::start_once(cluster, mode, settings) {
                Err(e) if attempt < BIND_ATTEMPTS && bind_conflict(&e) => attempt += 1,
                done => return done,
            }
        }
    }

    /// One start on a newly picked port, in a new directory.
    fn start_once(
        cluster: &Cluster,
        mode: PoolMode,
        settings: &Settings,
    ) -> Result<PgBouncer, KitError> {
        let binary = find_pgbouncer()?;
        let user = run_as()?;
        let dir = TempDir::new("lease-pgbouncer", user)?;
        let port = free_port()?;
        let path = dir.path();
        let ini = path.join("pgbouncer.ini");
        let userlist = path.join("userlist.txt");
        let pool_mode = match mode {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        };
        let config = format!(
            "[databases]\n\
             * = host={host} port={cluster_port}\n\
             postgres = host={host} port={cluster_port} dbname=postgres\n\
             \n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {userlist}\n\
             admin_users = postgres\n\
             pool_mode = {pool_mode}\n\
             max_client_conn = 100\n\
             default_pool_size = {pool_size}\n\
             server_login_retry = 1\n\
             ignore_startup_parameters = {ignored}\n\
             pidfile = {pidfile}\n",
            host = cluster.host(),
            cluster_port = cluster.port(),
            userlist = userlist.display(),
            pidfile = path.join("pgbouncer.pid").display(),
            pool_size = settings.pool_size,
            ignored = settings.ignore_startup_parameters.join(","),
        );
        fs::write(&ini, config).map_err(io_err(format!("writing {}", ini.display())))?;
        fs::write(&userlist, "\"postgres\" \"\"\n")
            .map_err(io_err(format!("writing {}", userlist.display())))?;
        // pgbouncer logs to stderr when not daemonized: that is the log file.
        let log_path = path.join("pgbouncer.log");
        let log =
            File::create(&log_path).map_err(io_err(format!("creating {}", log_path.display())))?;
        let stderr = log
            .try_clone()
            .map_err(io_err("duplicating the log file handle"))?;
        let mut child = command_as(&binary, user, path)
            .arg(&ini)
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(io_err(format!("spawning {}", binary.display())))?;
        let up = poll(Duration::from_secs(30), || {
            if let Some(status) = child.try_wait().map_err(io_err("waiting for pgbouncer"))? {
                return Err(KitError::Failed {
                    context: format!("pgbouncer exited during startup ({status})"),
                    detail: file_tail(&log_path, 30),
                });
            }
            Ok(port_open(port).then_some(()))
        });
        match up {
            Ok(Some(())) => Ok(PgBouncer {
                _dir: dir,
                port,
                child,
            }),
            failed => {
                let _ = child.kill();
                let _ = child.wait();
                Err(failed.err().unwrap_or_else(|| KitError::Timeout {
                    context: format!("pgbouncer did not listen on port {port} within 30 s"),
                    detail: file_tail(&log_path, 30),
                }))
            }
        }
    }

    /// The TCP port, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `host=127.0.0.1 port=PORT user=postgres dbname=postgres`.
    pub fn conn_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `pgbouncer` from `PATH`, else `/usr/sbin/pgbouncer`.
fn find_pgbouncer() -> Result<PathBuf, KitError> {
    env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            KitError::Missing(
                "pgbouncer not found in PATH or /usr/sbin: install pgbouncer: \
                 apt-get install pgbouncer (or run .ci/install-deps)"
                    .into(),
            )
        })
}
