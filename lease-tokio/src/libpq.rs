//! `Locker::from_env` and `Locker::from_conninfo` on tokio: lease-libpq's
//! resolution, connecting with tokio-postgres-rustls.

use lease_driver::{Config, Error, Resolve};
use lease_libpq::Conninfo;

use crate::TokioAdapter;

/// The TLS connector of [`Locker::from_env`](crate::Locker::from_env) and
/// [`Locker::from_conninfo`](crate::Locker::from_conninfo): tokio-postgres-rustls's,
/// over the rustls configuration lease-libpq resolved.
pub type Rustls = tokio_postgres_rustls::MakeRustlsConnect;

impl Resolve for TokioAdapter {
    type Tls = Rustls;

    fn resolve(conn: Option<&str>) -> Result<(Config, Rustls), Error> {
        let conninfo = match conn {
            Some(s) => Conninfo::parse(s),
            None => Conninfo::from_env(),
        }
        .map_err(|e| Error::Config(e.to_string()))?;
        Ok(split(conninfo))
    }
}

/// The configuration and connector of `conninfo`, its warnings logged.
fn split(conninfo: Conninfo) -> (Config, Rustls) {
    for warning in conninfo.warnings() {
        tracing::warn!("{warning}");
    }
    // Where, and whether TLS is required, verified or only taken if offered
    // (the same words as `lease run`'s first line).
    tracing::info!("lease connects to {conninfo}");
    let tls = Rustls::new((*conninfo.rustls()).clone());
    (conninfo.into_config(), tls)
}
