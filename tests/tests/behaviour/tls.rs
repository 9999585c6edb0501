//! Both drivers over TLS against an ephemeral server that accepts TCP
//! connections only over TLS (`hostssl`), certificates generated in the test:
//! the leader's graceful return hands over to a NOTIFY-woken standby, the
//! server confirms both sessions use TLS, and the chain and host name are
//! verified (rustls's WebPKI verifier against the test CA). lease-tokio
//! connects with tokio-postgres-rustls, lease-smol with its `rustls` feature.
//! Handover times are printed (`-- --nocapture`).

use crate::common::*;
use lease_proto::Options;
use lease_tests::Certs;
use lease_tests::Cluster;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;

const HBA: &str = "local all all trust\nhostssl all all 127.0.0.1/32 trust\n";

fn unique(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("tls-{name}-{}-{nanos}", std::process::id())
}

fn init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// rustls's default verification (chain and host name: libpq's
/// verify-full) against the test CA.
fn client_config(ca: &std::path::Path) -> rustls::ClientConfig {
    lease_tests::client_config(ca).expect("a client configuration")
}

fn config(c: &Cluster, host: &str, app: &str) -> tokio_postgres::Config {
    format!(
        "host={host} port={} user=postgres dbname=postgres sslmode=require application_name={app}",
        c.port()
    )
    .parse()
    .expect("parse the config")
}

/// The server's word that the sessions named `apps` run over TLS.
fn assert_over_tls(c: &Cluster, apps: &[&str]) {
    for app in apps {
        let ssl = c
            .sql(&format!(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE a.application_name = '{app}'"
            ))
            .expect("query pg_stat_ssl");
        assert_eq!(ssl, "t", "session {app}: ssl = {ssl:?}");
    }
}

/// A wrong CA: rustls refuses the server's certificate.
fn wrong_ca_message(err: &str) {
    assert!(err.contains("UnknownIssuer"), "{err}");
}

#[test]
fn tokio_verify_full_leads_and_hands_over() {
    init();
    let certs = Certs::generate("nobody").expect("certificates");
    let c = Cluster::start_tls(&certs, HBA).expect("a TLS PostgreSQL");
    // Multi-threaded: the server is asked (blocking) while the drivers run.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let handover = rt.block_on(async {
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(client_config(&certs.ca));
        let (a, driver) = lease_tokio::Locker::from_config(
            config(&c, "localhost", "tls-tokio-a"),
            tls.clone(),
            opts(),
        )
        .expect("locker a");
        tokio::spawn(driver);
        // The standby polls only every 5 s: a fast takeover is NOTIFY.
        let (b, driver) = lease_tokio::Locker::from_config(
            config(&c, "localhost", "tls-tokio-b"),
            tls,
            Options::default(),
        )
        .expect("locker b");
        tokio::spawn(driver);
        let name = unique("tokio");
        let started = Arc::new(tokio::sync::Notify::new());
        let finish = Arc::new(tokio::sync::Notify::new());
        let a_run = {
            let (name, started, finish) = (name.clone(), started.clone(), finish.clone());
            tokio::spawn(async move {
                a.run(&name, move |_| {
                    let (started, finish) = (started.clone(), finish.clone());
                    async move {
                        started.notify_one();
                        finish.notified().await;
                        Ok::<(), String>(())
                    }
                })
                .await
            })
        };
        started.notified().await;
        let b_started = Arc::new(Mutex::new(None));
        let b_run = {
            let (name, b_started) = (name.clone(), b_started.clone());
            tokio::spawn(async move {
                b.run(&name, move |_| {
                    let b_started = b_started.clone();
                    async move {
                        *b_started.lock().unwrap() = Some(Instant::now());
                        Ok::<(), String>(())
                    }
                })
                .await
            })
        };
        tokio::time::sleep(MS(300)).await;
        assert!(b_started.lock().unwrap().is_none(), "b ran while a led");
        let c = &c;
        tokio::task::block_in_place(|| assert_over_tls(c, &["tls-tokio-a", "tls-tokio-b"]));
        let returned = Instant::now();
        finish.notify_one();
        assert_eq!(a_run.await.expect("a's task"), Ok(()));
        let b = tokio::time::timeout(MS(2_000), b_run).await;
        assert_eq!(b.expect("b takes over").expect("b's task"), Ok(()));
        let started = b_started.lock().unwrap().expect("b started");
        started - returned
    });
    println!("lease-tokio over TLS (verify-full): handover {handover:?}");
    assert!(handover < MS(200), "{handover:?}");
    // The wrong CA: the connection fails on the certificate.
    let err = rt.block_on(async {
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(client_config(&certs.wrong_ca));
        config(&c, "localhost", "tls-tokio-wrong")
            .connect(tls)
            .await
            .err()
            .map(|e| lease_tests::error_chain(&e))
    });
    wrong_ca_message(&err.expect("the wrong CA is refused"));
}

#[test]
fn smol_verify_full_leads_and_hands_over() {
    init();
    let certs = Certs::generate("nobody").expect("certificates");
    let c = Cluster::start_tls(&certs, HBA).expect("a TLS PostgreSQL");
    let handover = smol::block_on(async {
        let tls = lease_smol::rustls::MakeRustls::new(client_config(&certs.ca));
        let (a, driver) = lease_smol::Locker::from_config(
            config(&c, "127.0.0.1", "tls-smol-a"),
            tls.clone(),
            opts(),
        )
        .expect("locker a");
        smol::spawn(driver).detach();
        let (b, driver) = lease_smol::Locker::from_config(
            config(&c, "127.0.0.1", "tls-smol-b"),
            tls,
            Options::default(),
        )
        .expect("locker b");
        smol::spawn(driver).detach();
        let name = unique("smol");
        let (started_tx, started_rx) = smol::channel::bounded::<()>(1);
        let (finish_tx, finish_rx) = smol::channel::bounded::<()>(1);
        let a_run = {
            let name = name.clone();
            smol::spawn(async move {
                a.run(&name, move |_| {
                    let (started, finish) = (started_tx.clone(), finish_rx.clone());
                    async move {
                        let _ = started.try_send(());
                        let _ = finish.recv().await;
                        Ok::<(), String>(())
                    }
                })
                .await
            })
        };
        started_rx.recv().await.expect("a leads");
        let b_started = Arc::new(Mutex::new(None));
        let b_run = {
            let (name, b_started) = (name.clone(), b_started.clone());
            smol::spawn(async move {
                b.run(&name, move |_| {
                    let b_started = b_started.clone();
                    async move {
                        *b_started.lock().unwrap() = Some(Instant::now());
                        Ok::<(), String>(())
                    }
                })
                .await
            })
        };
        smol::Timer::after(MS(300)).await;
        assert!(b_started.lock().unwrap().is_none(), "b ran while a led");
        // The drivers run on smol's global executor threads meanwhile.
        assert_over_tls(&c, &["tls-smol-a", "tls-smol-b"]);
        let returned = Instant::now();
        finish_tx.try_send(()).expect("finish a");
        assert_eq!(a_run.await, Ok(()));
        let b = futures_lite::future::or(async { Some(b_run.await) }, async {
            smol::Timer::after(MS(2_000)).await;
            None
        })
        .await;
        assert_eq!(b.expect("b takes over"), Ok(()));
        let started = b_started.lock().unwrap().expect("b started");
        started - returned
    });
    println!("lease-smol over TLS (verify-full): handover {handover:?}");
    assert!(handover < MS(200), "{handover:?}");
}
