//! Every log line a job emits carries its lease context: the driver enters a
//! `job` span (lease, key, run, token) for the job's call and for every poll.
//! Against the local PostgreSQL at 127.0.0.1:5432, with a captured subscriber.

use crate::common::*;
use lease_tokio::LeaseId;
use lease_tokio::Locker;
use lease_tokio::Options;
use serde_json::Value;
use std::io::Write;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;
use tracing_subscriber::fmt::MakeWriter;

/// Collects everything the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[test]
fn a_jobs_log_lines_carry_lease_key_run_and_token() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .with_writer(captured.clone())
        .finish();
    // This thread's subscriber: the runtime below runs everything on it.
    let _guard = tracing::subscriber::set_default(subscriber);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    let name = format!("span-{}-{nanos}", std::process::id());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let token = runtime.block_on(async {
        let (locker, driver) = Locker::without_tls(DB, Options::default()).expect("locker");
        tokio::spawn(driver);
        let token = Arc::new(Mutex::new(None));
        let seen = token.clone();
        let run = locker.run(&name, move |lease| {
            *seen.lock().unwrap() = Some(lease.token());
            tracing::info!("job called");
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                tracing::info!(step = 1, "job working");
                Ok::<(), std::convert::Infallible>(())
            }
        });
        tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect("the job ran within 10 s")
            .expect("run Ok");
        locker.close().await;
        let token = *token.lock().unwrap();
        token.expect("the job ran")
    });
    let key = LeaseId::named(&name).expect("valid name").key();
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).expect("utf-8 log");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON log line"))
        .collect();
    for message in ["job called", "job working"] {
        let line = lines
            .iter()
            .find(|l| l["fields"]["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} line in:\n{text}"));
        let span = &line["span"];
        assert_eq!(span["name"], "job", "{line}");
        assert_eq!(span["lease"], name.as_str(), "{line}");
        assert_eq!(span["key"], key, "{line}");
        assert_eq!(span["token"], token, "{line}");
        assert!(span["run"].is_u64(), "{line}");
    }
    // The driver's own lines are not inside a job's span.
    let acquired = lines
        .iter()
        .find(|l| l["fields"]["message"] == "lease acquired")
        .unwrap_or_else(|| panic!("no acquisition line in:\n{text}"));
    assert!(acquired.get("span").is_none(), "{acquired}");
}
