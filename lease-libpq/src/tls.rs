//! TLS: libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` over
//! rustls (ring provider), as one `rustls::ClientConfig`.
//!
//! libpq's meaning of each mode, and how it is mapped onto tokio-postgres's
//! three (`disable`, `prefer`, `require`):
//!
//! | sslmode | TLS | server certificate |
//! | --- | --- | --- |
//! | `disable` | never | - |
//! | `allow` | never (libpq would retry with TLS if the server refuses plaintext; `lease` does not) | - |
//! | `prefer` (default) | if the server offers it | chain checked only if a root certificate is given (libpq's rule); a failed check fails the attempt instead of falling back to plaintext |
//! | `require` | always | not verified; with a root certificate, as `verify-ca` (libpq's rule) |
//! | `verify-ca` | always | chain checked against the roots, host name not |
//! | `verify-full` | always | chain and host name checked |
//!
//! Roots: `sslrootcert=FILE` (PEM), `sslrootcert=system` (the platform's
//! store via rustls-native-certs; as in libpq only with `verify-full`, which
//! it then defaults to), or libpq's default `~/.postgresql/root.crt` when it
//! exists. Client certificate: `sslcert` and `sslkey` (PEM; default
//! `~/.postgresql/postgresql.crt` and `.key` when they exist), the key
//! refused if group or world can read it (libpq's rule). Named files are
//! read whatever the mode, `disable` and `allow` too: a missing one is an
//! error at resolution. libpq's default files are read only in a mode that
//! uses TLS.
//!
//! Nothing here ever formats a key, a certificate or a password into a
//! message: only paths, modes and rustls's reasons.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::error::{err, ConninfoError, ErrorKind};

/// libpq's `sslmode` (the crate docs' table says what each one does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// Never TLS here (libpq would retry with TLS if the server refuses
    /// plaintext).
    Allow,
    /// TLS if the server offers it (the default).
    Prefer,
    /// Always TLS; the certificate is checked only with a root certificate.
    Require,
    /// Always TLS; the chain is checked against the roots.
    VerifyCa,
    /// Always TLS; the chain and the host name are checked.
    VerifyFull,
}

impl SslMode {
    /// Parses a libpq `sslmode` value.
    pub fn parse(s: &str) -> Option<SslMode> {
        Some(match s {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// What tokio-postgres is told.
    pub fn tokio_postgres(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Pg;
        match self {
            SslMode::Disable | SslMode::Allow => Pg::Disable,
            SslMode::Prefer => Pg::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Pg::Require,
        }
    }

    /// Whether TLS may be used at all.
    pub fn uses_tls(self) -> bool {
        !matches!(self, SslMode::Disable | SslMode::Allow)
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        })
    }
}

/// Where the root certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Roots {
    /// A PEM file.
    File(PathBuf),
    /// The platform's store (`sslrootcert=system`).
    System,
}

impl fmt::Display for Roots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Roots::File(p) => write!(f, "{}", p.display()),
            Roots::System => f.write_str("the system's root certificates"),
        }
    }
}

/// The TLS settings of a connection, resolved (string, then environment,
/// then libpq's defaults).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub mode: SslMode,
    pub roots: Option<Roots>,
    /// Client certificate and key files.
    pub client: Option<(PathBuf, PathBuf)>,
    /// Whether the roots, and the client certificate or key, were named (in
    /// the string or the environment), not libpq's defaults in
    /// `~/.postgresql`: only named files are checked in a mode without TLS.
    pub named: (bool, bool),
}

/// How the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Not at all (the handshake's signatures still are).
    Nothing,
    /// The chain against the roots.
    Chain,
    /// The chain and the host name.
    Full,
}

impl Settings {
    fn check(&self) -> Check {
        match (self.mode, &self.roots) {
            (SslMode::VerifyFull, _) => Check::Full,
            (SslMode::VerifyCa, _) => Check::Chain,
            (SslMode::Prefer | SslMode::Require, Some(_)) => Check::Chain,
            _ => Check::Nothing,
        }
    }

    /// One phrase for the connection line: whether TLS is used and what is
    /// verified. Paths only, never contents.
    pub fn describe(&self) -> String {
        let mut out = match self.mode {
            SslMode::Disable => return "no TLS (sslmode=disable)".to_owned(),
            SslMode::Allow => {
                return "no TLS (sslmode=allow: plaintext, not retried with TLS)".to_owned()
            }
            SslMode::Prefer => "TLS if the server offers it (sslmode=prefer)".to_owned(),
            m => format!("TLS required (sslmode={m})"),
        };
        let roots = self
            .roots
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        out.push_str(&match self.check() {
            Check::Nothing => ", server certificate not verified".to_owned(),
            Check::Chain => {
                format!(", certificate chain verified against {roots}, host name not checked")
            }
            Check::Full => {
                format!(", certificate chain verified against {roots} and host name checked")
            }
        });
        if let Some((cert, _)) = &self.client {
            out.push_str(&format!(", client certificate {}", cert.display()));
        }
        out
    }

    /// The rustls configuration for these settings (files are read now: a
    /// missing or unreadable one is an error here, not at connect time).
    ///
    /// # Errors
    /// One line naming the file or setting and the reason.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, ConninfoError> {
        // Later rustls 0.23 releases (0.23.48, seen) deprecate it, the ring
        // provider moving to a crate of its own; a user's build that resolves
        // one of them must not warn.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        if !self.mode.uses_tls() {
            // Not used in this mode, but a file named wrong is found now, not
            // when the mode is raised. libpq's default files are not read:
            // `disable` stays the way around a bad one.
            if let (Some(roots @ Roots::File(_)), true) = (&self.roots, self.named.0) {
                load_roots(roots)?;
            }
            if let (Some((cert, key)), true) = (&self.client, self.named.1) {
                load_certs(cert, "sslcert")?;
                load_key(key)?;
            }
        }
        let check = if self.mode.uses_tls() {
            self.check()
        } else {
            Check::Nothing
        };
        let webpki = match (&self.roots, check) {
            (Some(roots), Check::Chain | Check::Full) => {
                let store = load_roots(roots)?;
                let verifier =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
                        .build()
                        .map_err(|e| {
                            err(
                                ErrorKind::Tls,
                                "sslrootcert",
                                format!("cannot use the root certificates in {roots}: {e}"),
                            )
                        })?;
                Some(verifier)
            }
            (None, Check::Chain | Check::Full) => {
                return Err(err(
                    ErrorKind::Inconsistent,
                    "sslrootcert",
                    format!(
                        "sslmode={} needs root certificates: give sslrootcert=FILE (or \
                         sslrootcert=system with verify-full), or PGSSLROOTCERT",
                        self.mode
                    ),
                ))
            }
            _ => None,
        };
        let verifier = Verifier {
            webpki,
            check,
            mode: self.mode,
            roots: self
                .roots
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            provider: provider.clone(),
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| err(ErrorKind::Tls, "sslmode", format!("cannot set up TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        let mut config = match &self.client {
            Some((cert, key)) if self.mode.uses_tls() => {
                let certs = load_certs(cert, "sslcert")?;
                let key = load_key(key)?;
                builder.with_client_auth_cert(certs, key).map_err(|e| {
                    err(
                        ErrorKind::Tls,
                        "sslcert",
                        format!("cannot use the client certificate {}: {e}", cert.display()),
                    )
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        // What PostgreSQL 17's direct TLS negotiation requires; ignored before.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The roots from `roots`.
fn load_roots(roots: &Roots) -> Result<RootCertStore, ConninfoError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            let certs = load_certs(path, "sslrootcert")?;
            let (_, ignored) = store.add_parsable_certificates(certs);
            if store.is_empty() {
                return Err(err(
                    ErrorKind::File,
                    "sslrootcert",
                    format!(
                        "sslrootcert {}: no usable certificate ({ignored} unparsable)",
                        path.display()
                    ),
                ));
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                let why = found
                    .errors
                    .first()
                    .map_or_else(|| "none found".to_owned(), ToString::to_string);
                return Err(err(
                    ErrorKind::File,
                    "sslrootcert",
                    format!(
                        "sslrootcert=system: cannot load the system's root certificates ({why})"
                    ),
                ));
            }
        }
    }
    Ok(store)
}

/// Every certificate in a PEM file.
fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, ConninfoError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(what, path, &e))?
        .collect();
    let certs = certs.map_err(|e| pem_error(what, path, &e))?;
    if certs.is_empty() {
        return Err(err(
            ErrorKind::File,
            what,
            format!("{what} {}: no PEM certificate in the file", path.display()),
        ));
    }
    Ok(certs)
}

/// The private key in a PEM file, refused (like libpq) if group or world
/// can read it: at most 0600 if owned by the current user, 0640 if owned by
/// root.
fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, ConninfoError> {
    let file = |message: String| err(ErrorKind::File, "sslkey", message);
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta =
            std::fs::metadata(path).map_err(|e| file(format!("sslkey {}: {e}", path.display())))?;
        if !meta.is_file() {
            return Err(file(format!(
                "sslkey {}: not a regular file",
                path.display()
            )));
        }
        let mode = meta.mode() & 0o777;
        let allowed = if meta.uid() == 0 { 0o640 } else { 0o600 };
        if mode & !allowed != 0 {
            return Err(file(format!(
                "sslkey {}: the private key file has group or world access (mode {mode:o}); \
                 permissions should be u=rw (0600) or less, or u=rw,g=r (0640) or less if owned \
                 by root",
                path.display()
            )));
        }
    }
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_error("sslkey", path, &e))
}

/// A PEM reading error, without the file's contents.
fn pem_error(what: &str, path: &Path, e: &rustls::pki_types::pem::Error) -> ConninfoError {
    use rustls::pki_types::pem::Error;
    let why = match e {
        Error::Io(io) => io.to_string(),
        Error::NoItemsFound => "no PEM item of the expected kind in the file".to_owned(),
        Error::MissingSectionEnd { .. } | Error::IllegalSectionStart { .. } => {
            "malformed PEM".to_owned()
        }
        Error::Base64Decode(_) => "malformed PEM (bad base64)".to_owned(),
        _ => "unreadable PEM".to_owned(),
    };
    err(
        ErrorKind::File,
        what,
        format!("{what} {}: {why}", path.display()),
    )
}

/// The server certificate check of one mode: rustls's WebPKI verifier for
/// the chain (and the name), or none; the handshake signatures are always
/// checked.
#[derive(Debug)]
struct Verifier {
    webpki: Option<Arc<WebPkiServerVerifier>>,
    check: Check,
    mode: SslMode,
    /// The roots, for messages.
    roots: String,
    provider: Arc<CryptoProvider>,
}

/// A rejected server certificate, in one line naming the mode and the
/// reason.
#[derive(Debug)]
struct Rejected(String);

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Rejected {}

impl Verifier {
    fn rejected(&self, e: &CertificateError) -> rustls::Error {
        let why = match e {
            CertificateError::UnknownIssuer => {
                format!("it is not signed by a CA in {}", self.roots)
            }
            CertificateError::BadSignature => "its signature is invalid".to_owned(),
            CertificateError::NotValidForName => "it is not valid for the host name".to_owned(),
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                format!("it has expired ({e})")
            }
            other => other.to_string(),
        };
        let text = format!(
            "sslmode={}: the server's certificate is rejected: {why}",
            self.mode
        );
        // `Other`: its Display is the text alone (a certificate error's
        // would be its Debug form).
        rustls::Error::Other(rustls::OtherError(Arc::new(Rejected(text))))
    }
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = &self.webpki else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Ok(ok) => Ok(ok),
            // The name is checked after the chain: for verify-ca, a chain
            // that passed is all that counts.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.check == Check::Chain => Ok(ServerCertVerified::assertion()),
            Err(rustls::Error::InvalidCertificate(e)) => Err(self.rejected(&e)),
            Err(e) => Err(e),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_map_onto_tokio_postgres() {
        use tokio_postgres::config::SslMode as Pg;
        for (s, m) in [
            ("disable", Pg::Disable),
            ("allow", Pg::Disable),
            ("prefer", Pg::Prefer),
            ("require", Pg::Require),
            ("verify-ca", Pg::Require),
            ("verify-full", Pg::Require),
        ] {
            let mode = SslMode::parse(s).unwrap();
            assert_eq!(mode.tokio_postgres(), m);
            assert_eq!(mode.to_string(), s);
        }
        assert!(SslMode::parse("verify_full").is_none());
    }

    #[test]
    fn require_with_roots_verifies_the_chain() {
        let s = Settings {
            mode: SslMode::Require,
            roots: Some(Roots::File("/x/ca.pem".into())),
            client: None,
            named: (true, false),
        };
        assert_eq!(s.check(), Check::Chain);
        assert!(s
            .describe()
            .contains("verified against /x/ca.pem, host name not"));
        let s = Settings { roots: None, ..s };
        assert_eq!(s.check(), Check::Nothing);
        assert!(s.describe().contains("not verified"), "{}", s.describe());
    }

    #[test]
    fn verify_modes_need_roots() {
        let s = Settings {
            mode: SslMode::VerifyFull,
            roots: None,
            client: None,
            named: (false, false),
        };
        let e = s.client_config().err().unwrap().to_string();
        assert!(
            e.contains("sslmode=verify-full needs root certificates"),
            "{e}"
        );
        let e = Settings {
            roots: Some(Roots::File("/nonexistent/ca.pem".into())),
            ..s
        }
        .client_config()
        .err()
        .unwrap()
        .to_string();
        assert!(e.starts_with("sslrootcert /nonexistent/ca.pem: "), "{e}");
    }
}
