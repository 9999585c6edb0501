//! `Locker::from_env` and `Locker::from_conninfo` on async-io: lease-libpq's
//! resolution, connecting with [`MakeRustls`] (no tokio runtime).

use lease_driver::{Config, Error, Resolve};
use lease_libpq::Conninfo;

use crate::rustls::MakeRustls;
use crate::SmolAdapter;

impl Resolve for SmolAdapter {
    type Tls = MakeRustls;

    fn resolve(conn: Option<&str>) -> Result<(Config, MakeRustls), Error> {
        let conninfo = match conn {
            Some(s) => Conninfo::parse(s),
            None => Conninfo::from_env(),
        }
        .map_err(|e| Error::Config(e.to_string()))?;
        for warning in conninfo.warnings() {
            tracing::warn!("{warning}");
        }
        // Where, and whether TLS is required, verified or only taken if offered
        // (the same words as `lease run`'s first line).
        tracing::info!("lease connects to {conninfo}");
        let tls = MakeRustls::from(conninfo.rustls());
        Ok((conninfo.into_config(), tls))
    }
}
