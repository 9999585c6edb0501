//! TLS over rustls, without tokio's runtime (feature `rustls`).
//!
//! [`MakeRustls`] implements [`SmolTls`] with tokio-rustls, which needs
//! only tokio's io traits (the driver's [`Socket`] has them): build a
//! rustls [`ClientConfig`] (roots, client certificate, crypto provider) and
//! wrap it. `Locker::from_env` and `Locker::from_conninfo` (feature
//! `libpq`) wrap the one lease-libpq resolves from `sslmode`,
//! `sslrootcert`, `sslcert` and `sslkey`; by hand:
//!
//! ```no_run
//! # fn demo(ca_pem: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
//! use rustls::pki_types::{pem::PemObject, CertificateDer};
//! let mut roots = rustls::RootCertStore::empty();
//! for cert in CertificateDer::pem_file_iter(ca_pem)? {
//!     roots.add(cert?)?;
//! }
//! let config = rustls::ClientConfig::builder_with_provider(
//!     rustls::crypto::ring::default_provider().into(),
//! )
//! .with_safe_default_protocol_versions()?
//! .with_root_certificates(roots)
//! .with_no_client_auth();
//! let (locker, driver) = lease_smol::Locker::from_config(
//!     "host=db.example.com user=app dbname=app sslmode=require".parse()?,
//!     lease_smol::rustls::MakeRustls::new(config),
//!     lease_smol::Options::default(),
//! )?;
//! # drop((locker, driver)); Ok(()) }
//! ```
//!
//! What is verified is what the `ClientConfig` verifies: with
//! `with_root_certificates`, the chain and the host name (libpq's
//! `verify-full`); the name is the connection's `host` (an IP literal is
//! checked against the certificate's IP addresses). Set `sslmode=require`
//! in the connection string so that a server without TLS is refused
//! (`prefer` would fall back to plaintext). Over a Unix socket or a bare
//! `hostaddr` there is no name to check: the TLS handshake fails (the
//! server never offers TLS on a Unix socket: use `prefer` or `disable`
//! there). Channel binding is not offered (`channel_binding=require`
//! fails; SCRAM authentication works without it).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect};
use tokio_rustls::TlsConnector;

// Not inlined: rustls's own page (its links are relative to rustls).
#[doc(no_inline)]
pub use ::rustls::ClientConfig;

use crate::{SmolTls, Socket};

/// A [`SmolTls`] over rustls: one [`ClientConfig`] for every host. Cheap to
/// clone.
#[derive(Clone)]
pub struct MakeRustls {
    connector: TlsConnector,
}

impl MakeRustls {
    /// Connects with `config`.
    pub fn new(config: ClientConfig) -> MakeRustls {
        MakeRustls::from(Arc::new(config))
    }
}

impl From<Arc<ClientConfig>> for MakeRustls {
    fn from(config: Arc<ClientConfig>) -> MakeRustls {
        MakeRustls {
            connector: TlsConnector::from(config),
        }
    }
}

impl std::fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MakeRustls").finish_non_exhaustive()
    }
}

impl SmolTls for MakeRustls {
    type TlsConnect = RustlsConnect;
    type Error = Infallible;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, Infallible> {
        Ok(RustlsConnect {
            connector: self.connector.clone(),
            name: ServerName::try_from(domain.to_owned()).ok(),
        })
    }
}

/// The connector for one host (made by [`MakeRustls`]).
pub struct RustlsConnect {
    connector: TlsConnector,
    /// `None`: no usable host name (a Unix socket, a bare `hostaddr`).
    name: Option<ServerName<'static>>,
}

impl TlsConnect<Socket> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let name = self.name.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "no host name to check the server's certificate against (a Unix socket or \
                     a bare hostaddr)",
                )
            })?;
            let stream = self.connector.connect(name, stream).await?;
            Ok(RustlsStream(stream))
        })
    }
}

/// A TLS connection (made by [`RustlsConnect`]).
pub struct RustlsStream(tokio_rustls::client::TlsStream<Socket>);

impl tokio_postgres::tls::TlsStream for RustlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for RustlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
