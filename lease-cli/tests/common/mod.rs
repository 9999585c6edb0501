//! What every `lease` command test needs: the binary with a clean
//! environment, a shared ephemeral server and unique lease names.

#![allow(dead_code)] // Each test file uses its own part of it.

use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use lease_tests::Cluster;

/// Every variable `lease` reads that the machine running the tests might
/// have set: libpq's, `DATABASE_URL` and `LEASE_LOG`.
pub const ENVIRONMENT: [&str; 17] = [
    "DATABASE_URL",
    "PGHOST",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGDATABASE",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "PGSSLCERT",
    "PGSSLKEY",
    "PGPASSFILE",
    "PGAPPNAME",
    "PGCONNECT_TIMEOUT",
    "PGTARGETSESSIONATTRS",
    "PGHOSTADDR",
    "PGOPTIONS",
    "LEASE_LOG",
];

/// `lease` with a clean environment (none of [`ENVIRONMENT`] inherited).
pub fn lease() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lease"));
    for var in ENVIRONMENT {
        cmd.env_remove(var);
    }
    cmd
}

/// One server shared by the tests of a file that run at the same time;
/// stopped when the last of them is done.
pub fn cluster() -> Arc<Cluster> {
    static SHARED: Mutex<Weak<Cluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = shared.upgrade() {
        return c;
    }
    let c = Arc::new(Cluster::start().expect("start an ephemeral PostgreSQL"));
    *shared = Arc::downgrade(&c);
    c
}

/// A lease name no other test (or earlier run) uses.
pub fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{name}-{}-{nanos}", std::process::id())
}
