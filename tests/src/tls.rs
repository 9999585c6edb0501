//! Certificates for TLS clusters, generated in the test with rcgen: a CA, a
//! server certificate for `localhost` and `127.0.0.1`, a client certificate
//! for one role (for `cert` authentication), and a second, unrelated CA.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::{io_err, KitError, TempDir};

/// PEM files in a temporary directory (removed on drop). Certificates are
/// world-readable, keys 0600 (owned by the test's user).
pub struct Certs {
    dir: TempDir,
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// A CA that signed nothing here: verification against it fails.
    pub wrong_ca: PathBuf,
    /// The server's certificate (`localhost`, `127.0.0.1`) and key.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// The client's certificate (common name: the role given to
    /// [`Certs::generate`]) and key.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

fn rc_err(what: &str) -> impl FnOnce(rcgen::Error) -> KitError + '_ {
    move |e| KitError::Failed {
        context: format!("generating {what}"),
        detail: e.to_string(),
    }
}

fn ca(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>, KitError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rc_err("a CA"))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().map_err(rc_err("a CA key"))?;
    CertifiedIssuer::self_signed(params, key).map_err(rc_err("a CA"))
}

impl Certs {
    /// Generates the CAs and certificates; the client certificate's common
    /// name is `client_role`.
    pub fn generate(client_role: &str) -> Result<Certs, KitError> {
        let dir = TempDir::new("lease-certs", None)?;
        let ca_issuer = ca("lease-tests CA")?;
        let wrong = ca("lease-tests unrelated CA")?;

        let server_key = KeyPair::generate().map_err(rc_err("a server key"))?;
        let mut params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .map_err(rc_err("the server certificate"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let server = params
            .signed_by(&server_key, &ca_issuer)
            .map_err(rc_err("the server certificate"))?;

        let client_key = KeyPair::generate().map_err(rc_err("a client key"))?;
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(rc_err("the client certificate"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, client_role);
        let client = params
            .signed_by(&client_key, &ca_issuer)
            .map_err(rc_err("the client certificate"))?;

        let path = |name: &str| dir.path().join(name);
        let certs = Certs {
            ca: path("ca.pem"),
            wrong_ca: path("wrong-ca.pem"),
            server_cert: path("server.crt"),
            server_key: path("server.key"),
            client_cert: path("client.crt"),
            client_key: path("client.key"),
            dir,
        };
        write(&certs.ca, &ca_issuer.pem(), 0o644)?;
        write(&certs.wrong_ca, &wrong.pem(), 0o644)?;
        write(&certs.server_cert, &server.pem(), 0o644)?;
        write(&certs.server_key, &server_key.serialize_pem(), 0o600)?;
        write(&certs.client_cert, &client.pem(), 0o644)?;
        write(&certs.client_key, &client_key.serialize_pem(), 0o600)?;
        Ok(certs)
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Writes `text` to `path` with `mode`.
pub(crate) fn write(path: &Path, text: &str, mode: u32) -> Result<(), KitError> {
    fs::write(path, text).map_err(io_err(format!("writing {}", path.display())))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(io_err(format!("chmod {}", path.display())))
}

/// A rustls client configuration (ring) that verifies in full, like libpq's
/// `sslmode=verify-full`: the chain against the CA certificates in the PEM
/// file `ca`, and the host name. For the kit's admin connection
/// ([`crate::scenario::Admin::connect_tls`]) and the `replica` binary's
/// `--tls-ca`.
pub fn client_config(ca: &Path) -> Result<rustls::ClientConfig, KitError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let failed = |detail: String| KitError::Failed {
        context: format!("reading the CA certificates in {}", ca.display()),
        detail,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| failed(e.to_string()))? {
        roots
            .add(cert.map_err(|e| failed(e.to_string()))?)
            .map_err(|e| failed(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(failed("no certificate in the file".into()));
    }
    let provider = rustls::crypto::ring::default_provider();
    Ok(rustls::ClientConfig::builder_with_provider(provider.into())
        .with_safe_default_protocol_versions()
        .map_err(|e| KitError::Failed {
            context: "rustls protocol versions".into(),
            detail: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
