//! Runs a job on one replica at a time. Start it in several terminals:
//! `cargo run -p lease-smol --example smol_singleton`, then stop the leader
//! (Ctrl-C) and watch a standby take over.

use std::time::Duration;

use futures_lite::future;
use lease_smol::{Locker, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=postgres".into());
    let (locker, driver) = Locker::without_tls(&url, Options::default())?;
    smol::block_on(async {
        smol::spawn(driver).detach();
        locker
            .run_until("example-singleton", ctrl_c(), |lease| async move {
                println!("leading with fencing token {}", lease.token());
                while !lease.is_cancelled() {
                    println!("working (valid: {})", lease.is_valid());
                    let tick = smol::Timer::after(Duration::from_secs(1));
                    let stop = async { println!("stopping: {}", lease.cancelled().await) };
                    future::or(
                        async {
                            tick.await;
                        },
                        stop,
                    )
                    .await;
                }
                Ok::<(), std::io::Error>(())
            })
            .await?;
        locker.close().await;
        Ok(())
    })
}

/// Resolves on the first Ctrl-C (at once if it cannot be caught).
#[cfg(unix)]
async fn ctrl_c() {
    use futures_lite::StreamExt;
    if let Ok(mut signals) = async_signal::Signals::new([async_signal::Signal::Int]) {
        signals.next().await;
    }
}

#[cfg(not(unix))]
async fn ctrl_c() {
    future::pending().await
}
