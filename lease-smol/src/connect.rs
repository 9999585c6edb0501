//! Opening a session without tokio: async-io sockets for `Config::connect_raw`.

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use async_io::{Async, Timer};
use futures_lite::FutureExt as _;
use lease_driver::{session_error, SessionError};
use socket2::{SockRef, TcpKeepalive};
use tokio_postgres::config::Host;
use tokio_postgres::tls::TlsConnect;
use tokio_postgres::{Client, Config, Connection, NoTls};
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt as _};
use tokio_util::either::Either;

/// Makes the TLS connector for each host, like tokio-postgres's
/// `MakeTlsConnect`, which exists only with tokio-postgres's "runtime"
/// feature (tokio's reactor), so is not used here. Implemented for
/// [`NoTls`](https://docs.rs/tokio-postgres/0.7/tokio_postgres/struct.NoTls.html); for TLS, wrap a connector that
/// implements tokio-postgres's `TlsConnect`, e.g. postgres-native-tls's
/// (with its default features off):
///
/// ```ignore
/// #[derive(Clone)]
/// struct Tls(native_tls::TlsConnector);
///
/// impl lease_smol::SmolTls for Tls {
///     type TlsConnect = postgres_native_tls::TlsConnector;
///     type Error = std::convert::Infallible;
///     fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
///         Ok(postgres_native_tls::TlsConnector::new(self.0.clone(), domain))
///     }
/// }
/// ```
pub trait SmolTls: Clone + Send + Sync + 'static {
    /// The connector for one host.
    type TlsConnect: TlsConnect<Socket, Stream: Send, Future: Send> + Send;
    /// Why no connector could be made.
    type Error: Into<Box<dyn std::error::Error + Send + Sync>>;

    /// The connector for `domain`, the host name to verify the certificate
    /// against and send as SNI (empty for a Unix socket or a bare `hostaddr`).
    ///
    /// # Errors
    /// When no connector can be made; the attempt then fails like a refused
    /// connection.
    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error>;
}

impl SmolTls for NoTls {
    type TlsConnect = NoTls;
    type Error = std::convert::Infallible;

    fn make_tls_connect(&mut self, _: &str) -> Result<NoTls, Self::Error> {
        Ok(NoTls)
    }
}

/// The stream a connection of `T` runs over.
pub(crate) type TlsStream<T> = <<T as SmolTls>::TlsConnect as TlsConnect<Socket>>::Stream;

pub(crate) type Connected<S> = Result<(Client, Connection<Socket, S>), SessionError>;

/// The byte stream the driver opens with async-io and hands to tokio-postgres
/// (and to the TLS connector): a TCP connection, or a Unix socket's.
pub type Socket = Either<Compat<Async<TcpStream>>, Compat<Async<Unix>>>;

#[cfg(unix)]
type Unix = std::os::unix::net::UnixStream;
#[cfg(not(unix))]
type Unix = TcpStream;

/// Opens a session like `Config::connect`, over async-io sockets: each host in
/// order, each of its addresses in order (`hostaddr` skips name resolution);
/// the first that connects wins, else the last error counts. Unlike
/// tokio-postgres (like libpq), `connect_timeout` bounds each address's whole
/// attempt, so a host that accepts but never answers does not stall failover.
pub(crate) async fn connect<T: SmolTls>(config: Config, mut tls: T) -> Connected<TlsStream<T>> {
    let (hosts, addrs, ports) = (
        config.get_hosts(),
        config.get_hostaddrs(),
        config.get_ports(),
    );
    let mut error = SessionError::other("no host given");
    for i in 0..hosts.len().max(addrs.len()) {
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let targets = match (addrs.get(i), hosts.get(i)) {
            (Some(ip), _) => Ok(vec![Target::Tcp(SocketAddr::new(*ip, port))]),
            // Blocks this thread for the lookup unless `host` is an IP literal.
            (None, Some(Host::Tcp(host))) => (host.as_str(), port)
                .to_socket_addrs()
                .map(|addrs| addrs.map(Target::Tcp).collect()),
            #[cfg(unix)]
            (None, Some(Host::Unix(dir))) => {
                Ok(vec![Target::Unix(dir.join(format!(".s.PGSQL.{port}")))])
            }
            (None, None) => break,
        };
        let targets = match targets {
            Ok(targets) => targets,
            Err(e) => {
                error = SessionError::other(format!("error connecting to server: {e}"));
                continue;
            }
        };
        if targets.is_empty() {
            error =
                SessionError::other("error connecting to server: could not resolve any addresses");
        }
        // The host name, if any, is what TLS verifies.
        let name = match hosts.get(i) {
            Some(Host::Tcp(name)) => name.as_str(),
            _ => "",
        };
        for target in targets {
            let tls = tls.make_tls_connect(name).map_err(|e| {
                let e = e.into();
                SessionError::config(format!("error performing TLS handshake: {e}"))
            });
            let attempt = async {
                let socket = target
                    .open(&config)
                    .await
                    .map_err(|e| SessionError::other(format!("error connecting to server: {e}")))?;
                let connected = config.connect_raw(socket, tls?).await;
                connected.map_err(|e| session_error(&e))
            };
            let expired = async {
                let timeout = config.get_connect_timeout().copied();
                Timer::after(timeout.unwrap_or(Duration::MAX)).await;
                Err(SessionError::other(
                    "error connecting to server: connection timed out",
                ))
            };
            match attempt.or(expired).await {
                Ok(connected) => return Ok(connected),
                Err(e) => error = e,
            }
        }
    }
    Err(error)
}

/// Where one connection attempt goes.
enum Target {
    Tcp(SocketAddr),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

impl Target {
    async fn open(self, config: &Config) -> io::Result<Socket> {
        match self {
            Target::Tcp(addr) => {
                let stream = Async::<TcpStream>::connect(addr).await?;
                tune(stream.get_ref(), config)?;
                Ok(Either::Left(stream.compat()))
            }
            #[cfg(unix)]
            Target::Unix(path) => Ok(Either::Right(Async::<Unix>::connect(path).await?.compat())),
        }
    }
}

/// Sets the socket options `Config::connect` would: no delay, keepalives and,
/// on Linux, `tcp_user_timeout`.
fn tune(stream: &TcpStream, config: &Config) -> io::Result<()> {
    let socket = SockRef::from(stream);
    socket.set_nodelay(true)?;
    #[cfg(target_os = "linux")]
    socket.set_tcp_user_timeout(config.get_tcp_user_timeout().copied())?;
    if !config.get_keepalives() {
        return Ok(());
    }
    let mut keepalive = TcpKeepalive::new().with_time(config.get_keepalives_idle());
    #[cfg(not(any(
        target_os = "aix",
        target_os = "redox",
        target_os = "solaris",
        target_os = "openbsd"
    )))]
    if let Some(interval) = config.get_keepalives_interval() {
        keepalive = keepalive.with_interval(interval);
    }
    #[cfg(not(any(
        target_os = "aix",
        target_os = "redox",
        target_os = "solaris",
        target_os = "windows",
        target_os = "openbsd"
    )))]
    if let Some(retries) = config.get_keepalives_retries() {
        keepalive = keepalive.with_retries(retries);
    }
    socket.set_tcp_keepalive(&keepalive)
}
