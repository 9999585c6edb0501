//! Both drivers against the local PostgreSQL at 127.0.0.1:5432 (trust auth): one suite,
//! run once per runtime.
//!
//! The tests are written once, in `suite.rs`. `tokio_driver.rs` and `smol_driver.rs` each
//! alias their crate as `lease`, define the adapter `rt` (building a locker, spawning and
//! cancelling tasks, `block_on`, `sleep`, `timeout`, an observing client: every
//! constructor call and runtime primitive the suite uses), and include `suite.rs` as
//! their `suite` module. So every test runs as `tokio_driver::suite::<test>` and
//! `smol_driver::suite::<test>`; tests that only one driver can pass sit beside the
//! adapter in that driver's file. Lease names carry the runtime's name, the test's,
//! the process id and the time, so the two instances, other test runs and other users
//! of the server never contend for a key.
//!
//! Driver tests that cannot be shared stay in their crate (lease-smol's thread count
//! and dependency graph).

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

mod smol_driver;
mod tokio_driver;

use crate::common::{init, key, opts, DB, MS};

type Res = Result<(), String>;

/// A lease name no other test, runtime or earlier test run uses.
fn unique(runtime: &str, name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!("{runtime}-{name}-{}-{nanos}", std::process::id())
}

/// How many sessions hold `key`, seen from `client` (another session).
async fn holders_seen_by(client: &tokio_postgres::Client, key: i64) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND granted AND ((classid::bigint << 32) | objid::bigint) = $1",
            &[&key],
        )
        .await
        .expect("query pg_locks")
        .get(0)
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<Mutex<bool>>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = true;
    }
}
