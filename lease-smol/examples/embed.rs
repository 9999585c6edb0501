//! The driver embedded in your own executor: a `LocalExecutor` run by
//! `futures_lite::future::block_on` on this one thread, beside the runs and
//! their jobs (which need not be `Send`). No thread is started but async-io's
//! reactor. `cargo run -p lease-smol --example embed`
//!
//! Any executor works the same way: the driver is a plain future, and so is
//! every run.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future;
use lease_smol::{Locker, Options};
use smol::{LocalExecutor, Timer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=postgres".into());
    let (locker, driver) = Locker::without_tls(&url, Options::default())?;
    let ex = LocalExecutor::new();
    ex.spawn(driver).detach();
    // Shared by the jobs on this thread: not `Send`, and it need not be.
    let rounds = Rc::new(Cell::new(0));
    future::block_on(ex.run(async {
        let runs = ["example-embed-a", "example-embed-b"].map(|name| {
            let rounds = rounds.clone();
            ex.spawn(locker.run(name, move |lease| {
                let rounds = rounds.clone();
                async move {
                    println!("{} leading with token {}", lease.name(), lease.token());
                    for _ in 0..3 {
                        if !lease.is_valid() {
                            return Ok(()); // called again on the next win
                        }
                        rounds.set(rounds.get() + 1);
                        Timer::after(Duration::from_millis(300)).await;
                    }
                    Ok::<(), std::io::Error>(())
                }
            }))
        });
        for run in runs {
            run.await?;
        }
        println!(
            "{} rounds of work, status: {:?}",
            rounds.get(),
            locker.status()
        );
        locker.close().await; // ends the driver
        Ok(())
    }))
}
