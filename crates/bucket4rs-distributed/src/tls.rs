//! TLS for the remote backends, through rustls on ring (no OpenSSL, no system library): the
//! roots a server's certificate is checked against (the platform's, plus private CAs from PEM
//! files), a client certificate for mutual TLS, and the typed cause of a failed handshake.

use core::fmt;
use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(feature = "postgres")]
use rustls::client::WebPkiServerVerifier;
#[cfg(feature = "postgres")]
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
#[cfg(feature = "postgres")]
use rustls::crypto::WebPkiSupportedAlgorithms;
#[cfg(any(feature = "postgres", feature = "redis"))]
use rustls::pki_types::ServerName;
#[cfg(feature = "postgres")]
use rustls::pki_types::UnixTime;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{AlertDescription, CertificateError};
#[cfg(any(feature = "postgres", feature = "redis"))]
use rustls::{ClientConfig, RootCertStore};
#[cfg(feature = "postgres")]
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::error::{BackendError, BackendErrorKind};

/// Why a TLS connection to a remote store could not be set up or was refused.
///
/// A backend reports a failed handshake as a non-retryable
/// [`BackendErrorKind::Unavailable`] whose [`source`](std::error::Error::source) is this
/// error: a certificate problem does not go away by trying again within a call (the backend
/// keeps connecting in the background, so a fixed server is used without a restart).
///
/// ```
/// use bucket4rs_distributed::{BackendError, TlsError};
/// use std::error::Error;
/// fn cause(e: &BackendError) -> Option<&TlsError> {
///     e.source()?.downcast_ref::<TlsError>()
/// }
/// assert_eq!(
///     TlsError::HostnameMismatch.to_string(),
///     "TLS: the server's certificate is not valid for the host name connected to (hostname mismatch)"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read, or holds no certificate or key where one was expected.
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The server's certificate is not signed by a certificate authority this client trusts
    /// (neither the platform's roots nor a CA file).
    UnknownIssuer,
    /// The server's certificate is not valid for the host name connected to.
    HostnameMismatch,
    /// The server's certificate is not acceptable otherwise (expired, not yet valid, revoked,
    /// malformed): what rustls reported.
    BadCertificate(String),
    /// The server refused this client's certificate, or wanted one and got none (mutual TLS).
    ClientCertificateRejected(String),
    /// The server did not answer in TLS: a plaintext server where TLS was asked for.
    NotTls,
    /// The handshake failed otherwise: what rustls reported.
    Handshake(String),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File { path, reason } => write!(f, "TLS: {}: {reason}", path.display()),
            Self::UnknownIssuer => f.write_str(
                "TLS: the server's certificate is not signed by a trusted certificate authority \
                 (unknown issuer; a private CA needs a CA file)",
            ),
            Self::HostnameMismatch => f.write_str(
                "TLS: the server's certificate is not valid for the host name connected to \
                 (hostname mismatch)",
            ),
            Self::BadCertificate(why) => write!(f, "TLS: the server's certificate is invalid: {why}"),
            Self::ClientCertificateRejected(why) => write!(
                f,
                "TLS: the server refused the client certificate or needs one (mutual TLS): {why}"
            ),
            Self::NotTls => f.write_str(
                "TLS: the server did not answer in TLS (a plaintext server where TLS was asked for)",
            ),
            Self::Handshake(why) => write!(f, "TLS: the handshake failed: {why}"),
        }
    }
}

impl StdError for TlsError {}

impl TlsError {
    /// The backend error of a failed handshake: unavailable, not retryable within the call,
    /// nor by the caller (the same handshake fails until the certificates or the URL change).
    pub(crate) fn into_backend(self) -> BackendError {
        BackendError::new(BackendErrorKind::Unavailable, self.to_string())
            .refused_until_fixed(true)
            .with_source(self)
    }

    /// The TLS cause of a failed connection, if it was one: the rustls error somewhere in
    /// `e`'s chain (drivers wrap it in an I/O error, whose `source` skips it, so each I/O
    /// error's inner error is looked at too).
    pub(crate) fn cause(e: &(dyn StdError + 'static)) -> Option<Self> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(r) = e.downcast_ref::<rustls::Error>() {
                return Some(Self::of(r));
            }
            // The `redis` crate keeps its cause as an `Arc<dyn Error>`.
            if let Some(inner) = e
                .downcast_ref::<Arc<dyn StdError + Send + Sync>>()
                .and_then(|arc| Self::cause(arc.as_ref()))
            {
                return Some(inner);
            }
            if let Some(inner) = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| Self::cause(inner))
            {
                return Some(inner);
            }
            next = e.source();
        }
        None
    }

    fn of(e: &rustls::Error) -> Self {
        use rustls::Error as E;
        match e {
            E::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer => Self::UnknownIssuer,
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => Self::HostnameMismatch,
                other => Self::BadCertificate(format!("{other:?}")),
            },
            E::AlertReceived(
                a @ (AlertDescription::CertificateRequired
                | AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateUnknown
                | AlertDescription::UnsupportedCertificate
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateRevoked
                | AlertDescription::AccessDenied),
            ) => Self::ClientCertificateRejected(format!("{a:?}")),
            E::InvalidMessage(_) => Self::NotTls,
            other => Self::Handshake(other.to_string()),
        }
    }
}

/// The certificates a TLS connection to a remote store trusts and presents: the platform's
/// roots plus private certificate authorities from PEM files, and optionally a client
/// certificate (mutual TLS). Used by `RedisOptions::tls` (for `rediss://` URLs) and
/// `PostgresOptions::tls`.
///
/// ```no_run
/// use bucket4rs_distributed::TlsOptions;
/// let tls = TlsOptions::default()
///     .ca_file("/etc/ssl/private-ca.pem")?                            // besides the platform's roots
///     .client_identity_files("/etc/app/client.pem", "/etc/app/client.key")?; // mutual TLS
/// # Ok::<(), bucket4rs_distributed::TlsError>(())
/// ```
#[derive(Default)]
pub struct TlsOptions {
    cas: Vec<CertificateDer<'static>>,
    identity: Option<Identity>,
}

struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    /// As read, for the `redis` crate, which takes PEM.
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl Clone for TlsOptions {
    fn clone(&self) -> Self {
        Self {
            cas: self.cas.clone(),
            identity: self.identity.as_ref().map(|i| Identity {
                chain: i.chain.clone(),
                key: i.key.clone_key(),
                cert_pem: i.cert_pem.clone(),
                key_pem: i.key_pem.clone(),
            }),
        }
    }
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("private_cas", &self.cas.len())
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::File {
            path: path.to_owned(),
            reason: format!("not a PEM certificate file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::File {
            path: path.to_owned(),
            reason: "no certificate in it".into(),
        });
    }
    Ok(certs)
}

/// How much of the server's certificate is checked.
#[cfg(any(feature = "postgres", feature = "redis"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verify {
    /// The chain to a trusted root and the host name (`rediss://`, `verify-full`).
    Full,
    /// The chain to a trusted root, not the host name (`verify-ca`).
    #[cfg(feature = "postgres")]
    Chain,
    /// Nothing but the handshake's own signatures: encryption without authentication
    /// (PostgreSQL's `prefer` and `require`, as libpq does without a root certificate).
    #[cfg(feature = "postgres")]
    Nothing,
}

impl TlsOptions {
    /// Trusts the certificate authorities in the PEM file at `path` besides the platform's
    /// roots (a private CA of a self-hosted server or of a managed service).
    ///
    /// # Errors
    /// [`TlsError::File`] if the file cannot be read or holds no certificate.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::TlsOptions;
    /// let tls = TlsOptions::default().ca_file("ca.pem")?;
    /// # Ok::<(), bucket4rs_distributed::TlsError>(())
    /// ```
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> Result<Self, TlsError> {
        let path = path.as_ref();
        let pem = read(path)?;
        self.cas.extend(certificates(path, &pem)?);
        Ok(self)
    }

    /// Presents the certificate chain in the PEM file `cert` with the private key in the PEM
    /// file `key` when the server asks for one (mutual TLS).
    ///
    /// # Errors
    /// [`TlsError::File`] if a file cannot be read, or holds no certificate or no key.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::TlsOptions;
    /// let tls = TlsOptions::default().client_identity_files("client.pem", "client.key")?;
    /// # Ok::<(), bucket4rs_distributed::TlsError>(())
    /// ```
    pub fn client_identity_files(
        mut self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, TlsError> {
        let (cert, key) = (cert.as_ref(), key.as_ref());
        let cert_pem = read(cert)?;
        let chain = certificates(cert, &cert_pem)?;
        let key_pem = read(key)?;
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::File {
            path: key.to_owned(),
            reason: format!("no private key in it: {e}"),
        })?;
        self.identity = Some(Identity {
            chain,
            key: private,
            cert_pem,
            key_pem,
        });
        Ok(self)
    }

    pub(crate) fn has_private_cas(&self) -> bool {
        !self.cas.is_empty()
    }

    /// The platform's roots and the private CAs.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        // Certificates the platform store holds that rustls cannot use are skipped; a
        // platform without a store leaves only the private CAs (a server signed by another
        // CA is then an `UnknownIssuer`, named as such).
        roots.add_parsable_certificates(platform_roots().iter().cloned());
        roots.add_parsable_certificates(self.cas.iter().cloned());
        roots
    }

    /// A rustls client configuration checking the server's certificate as `verify` says.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn client_config(&self, verify: Verify) -> Result<ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Handshake(e.to_string()))?;
        let roots = Arc::new(self.roots());
        let builder = match verify {
            Verify::Full => builder.with_root_certificates(roots),
            #[cfg(feature = "postgres")]
            Verify::Chain | Verify::Nothing => {
                let inner = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| TlsError::Handshake(e.to_string()))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(Partial {
                        inner,
                        chain: verify == Verify::Chain,
                        algorithms: provider.signature_verification_algorithms,
                    }))
            }
        };
        Ok(match &self.identity {
            Some(i) => builder
                .with_client_auth_cert(i.chain.clone(), i.key.clone_key())
                .map_err(|e| TlsError::Handshake(format!("the client certificate: {e}")))?,
            None => builder.with_no_client_auth(),
        })
    }

    /// The certificates as the `redis` crate takes them (PEM): the roots only when private
    /// CAs are given (else the crate loads the platform's roots itself), the identity if any.
    #[cfg(feature = "redis")]
    pub(crate) fn redis_certificates(&self) -> redis::TlsCertificates {
        use base64::Engine as _;
        let root_cert = self.has_private_cas().then(|| {
            let mut pem = String::new();
            for root in self.roots_der() {
                let b64 = base64::engine::general_purpose::STANDARD.encode(root.as_ref());
                pem.push_str("-----BEGIN CERTIFICATE-----\n");
                for line in b64.as_bytes().chunks(64) {
                    pem.push_str(&String::from_utf8_lossy(line));
                    pem.push('\n');
                }
                pem.push_str("-----END CERTIFICATE-----\n");
            }
            pem.into_bytes()
        });
        redis::TlsCertificates {
            client_tls: self.identity.as_ref().map(|i| redis::ClientTlsConfig {
                client_cert: i.cert_pem.clone(),
                client_key: i.key_pem.clone(),
            }),
            root_cert,
        }
    }

    /// The platform's roots and the private CAs, as certificates.
    #[cfg(feature = "redis")]
    fn roots_der(&self) -> Vec<CertificateDer<'static>> {
        let mut all = platform_roots().to_vec();
        all.extend(self.cas.iter().cloned());
        all
    }
}

/// The platform's root certificates, read once per process (a few hundred files: tens of
/// milliseconds, too long to repeat for every backend).
fn platform_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: std::sync::OnceLock<Vec<CertificateDer<'static>>> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| rustls_native_certs::load_native_certs().certs)
}

/// Why a TLS connection to `host:port` with `config` is refused, found by making one within
/// `budget`: the handshake, then a `PING` and the first byte of its answer (a server that
/// refuses the client's certificate says so after a TLS 1.3 handshake). `None` when the
/// connection is accepted, or no verdict comes (nothing listens, no answer in time). For a
/// client whose driver reports a refused handshake only as text (the `redis` crate's cluster
/// connection): the same configuration ([`TlsOptions::client_config`]), met again here, names
/// the cause as a type.
#[cfg(feature = "redis")]
pub(crate) async fn refusal(
    config: Arc<ClientConfig>,
    host: &str,
    port: u16,
    budget: core::time::Duration,
) -> Option<TlsError> {
    use std::io::{Read as _, Write as _};
    let name = ServerName::try_from(host.to_owned()).ok()?;
    let addr = (host.to_owned(), port);
    let probe = tokio::task::spawn_blocking(move || -> Result<(), std::io::Error> {
        let deadline = std::time::Instant::now() + budget;
        let addrs = std::net::ToSocketAddrs::to_socket_addrs(&addr)?;
        let mut last = std::io::Error::from(std::io::ErrorKind::NotFound);
        for a in addrs {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            match std::net::TcpStream::connect_timeout(&a, left) {
                Ok(mut socket) => {
                    let left = deadline
                        .saturating_duration_since(std::time::Instant::now())
                        .max(core::time::Duration::from_millis(1));
                    socket.set_read_timeout(Some(left))?;
                    socket.set_write_timeout(Some(left))?;
                    let mut conn = rustls::ClientConnection::new(config, name)
                        .map_err(std::io::Error::other)?;
                    let mut tls = rustls::Stream::new(&mut conn, &mut socket);
                    tls.write_all(b"PING\r\n")?;
                    let mut first = [0u8; 1];
                    tls.read_exact(&mut first)?;
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    });
    match tokio::time::timeout(budget, probe).await {
        Ok(Ok(Err(e))) => TlsError::cause(&e),
        _ => None,
    }
}

/// Makes ring the process's rustls provider unless one is installed already: the `redis`
/// crate builds its TLS configuration with the process default.
#[cfg(feature = "redis")]
pub(crate) fn install_provider() {
    let _ =
        rustls::crypto::CryptoProvider::install_default(rustls::crypto::ring::default_provider());
}

/// A verifier that checks less than the full one: the chain without the host name
/// (`verify-ca`), or only the handshake's signatures (PostgreSQL's `prefer`/`require`).
#[cfg(feature = "postgres")]
#[derive(Debug)]
struct Partial {
    inner: Arc<WebPkiServerVerifier>,
    chain: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

#[cfg(feature = "postgres")]
impl ServerCertVerifier for Partial {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if !self.chain {
            return Ok(ServerCertVerified::assertion());
        }
        // webpki checks the chain before the name: a name error means the chain was good.
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
