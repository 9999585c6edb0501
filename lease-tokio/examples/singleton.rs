//! Runs a job on one replica at a time. Start it in several terminals:
//! `cargo run -p lease-tokio --example singleton`, then stop the leader
//! (Ctrl-C) and watch a standby take over.

use std::time::Duration;

use lease_tokio::{Locker, Options};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=postgres".into());
    let (locker, driver) = Locker::without_tls(&url, Options::default())?;
    tokio::spawn(driver);
    let ctrl_c = async { tokio::signal::ctrl_c().await.unwrap_or(()) };
    locker
        .run_until("example-singleton", ctrl_c, |lease| async move {
            println!("leading with fencing token {}", lease.token());
            while !lease.is_cancelled() {
                println!("working (valid: {})", lease.is_valid());
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    reason = lease.cancelled() => println!("stopping: {reason}"),
                }
            }
            Ok::<(), std::io::Error>(())
        })
        .await?;
    locker.close().await;
    Ok(())
}
