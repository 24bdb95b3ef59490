//! TLS on the TCP control channel (cargo feature `tls`, on by default): the handshake frames
//! (QPN, PSN, GID, ring address and rkey, the auth token; see [`crate::wire::Handshake`]) cross
//! the network inside a TLS session (rustls, with its `ring` crypto provider; TLS 1.2 and 1.3)
//! instead of in clear. Only the control channel is wrapped: the data path (verbs) is unchanged,
//! and the TLS state is dropped once the handshake reply is exchanged (the TCP connection then
//! only carries liveness, as without TLS). Plaintext is the default: TLS is used when
//! [`ServerConfig::tls`](crate::ServerConfig::tls) / [`ClientConfig::tls`](crate::ClientConfig::tls)
//! is set, and then both ends must have it.
//!
//! - [`ServerTls`]: the server's certificate chain and private key (PEM or DER), and optionally
//!   the roots that client certificates must chain to (mutual TLS).
//! - [`ClientTls`]: the roots the server's certificate must chain to, the name it must be valid
//!   for, and optionally a client certificate and key (for a server that requires one).
//!
//! Failures end the connect with a status naming what went wrong, within the handshake timeouts
//! (`ClientConfig::connect_timeout`, `ServerConfig::handshake_timeout`), and never disturb the
//! listener or other sessions:
//! - the server's certificate does not chain to the client's roots, is not valid for the server
//!   name, or has expired: UNAUTHENTICATED (client side);
//! - the server refuses the client's certificate (none, or not from its client roots):
//!   UNAUTHENTICATED;
//! - a plaintext client to a TLS server: the server refuses it in plaintext, UNAVAILABLE naming
//!   `ServerConfig::tls`; a TLS client to a plaintext server: UNAVAILABLE naming
//!   `ClientConfig::tls`.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{AlertDescription, CertificateError, RootCertStore};

use crate::status::Status;
use crate::wire::{read_frame, write_frame, Frame, FrameError, MAX_FRAME};

/// A TLS configuration that could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM input held no usable item of the kind needed.
    #[error("{what}: {reason}")]
    Pem {
        /// Which input (`certificate chain`, `private key`, `roots`...).
        what: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// rustls refused the configuration (a key that does not match the certificate, an
    /// unsupported key type, a root that does not parse...).
    #[error("{what}: {source}")]
    Rustls {
        /// What was being configured.
        what: &'static str,
        /// rustls' error.
        source: rustls::Error,
    },
    /// The server name is not a valid DNS name or IP address.
    #[error("server name {name:?} is not a DNS name or IP address")]
    ServerName {
        /// The name given.
        name: String,
    },
}

/// rustls' `ring` provider: it builds with a C compiler alone (the default `aws-lc-rs` provider
/// needs cmake, and nasm elsewhere). rustls 0.23.48 deprecates it for its lack of post-quantum
/// key exchange; the control channel's secrets (the token, rkeys) matter for the session's life.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_certs(what: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem { what, reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Pem { what, reason: "no CERTIFICATE section".into() });
    }
    Ok(certs)
}

fn pem_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Pem {
        what: "private key",
        reason: format!("{e} (a PKCS#8, PKCS#1 or SEC1 PRIVATE KEY section is needed)"),
    })
}

fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|e| TlsError::Pem { what, reason: format!("reading {}: {e}", path.display()) })
}

fn root_store(what: &'static str, roots: Vec<CertificateDer<'static>>) -> Result<RootCertStore, TlsError> {
    if roots.is_empty() {
        return Err(TlsError::Pem { what, reason: "no root certificate".into() });
    }
    let mut store = RootCertStore::empty();
    for r in roots {
        store.add(r).map_err(|source| TlsError::Rustls { what, source })?;
    }
    Ok(store)
}

/// The server's TLS configuration ([`ServerConfig::tls`](crate::ServerConfig::tls)): its
/// certificate chain and private key, and, for mutual TLS, the roots client certificates must
/// chain to. Session tickets are off (a session's control connection does one handshake).
/// Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    client_auth: bool,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("ServerTls")
            .field("chain_len", &self.chain.len())
            .field("client_auth", &self.client_auth)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// From a DER certificate chain (the server's certificate first, then its intermediates)
    /// and its private key. No client certificate is asked for.
    ///
    /// # Errors
    /// [`TlsError::Pem`] for an empty chain; [`TlsError::Rustls`] when rustls refuses the key
    /// (unsupported type, or not the certificate's).
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<ServerTls, TlsError> {
        if chain.is_empty() {
            return Err(TlsError::Pem { what: "certificate chain", reason: "no certificate".into() });
        }
        let key = Arc::new(key);
        let config = Self::build(&chain, &key, None)?;
        Ok(ServerTls { config, chain, key, client_auth: false })
    }

    /// From PEM: `chain_pem` holds the server's certificate then its intermediates
    /// (`CERTIFICATE` sections), `key_pem` its private key (PKCS#8, PKCS#1 or SEC1).
    ///
    /// # Errors
    /// [`TlsError::Pem`] when either holds no usable section; see [`ServerTls::new`].
    pub fn from_pem(chain_pem: &[u8], key_pem: &[u8]) -> Result<ServerTls, TlsError> {
        ServerTls::new(pem_certs("certificate chain", chain_pem)?, pem_key(key_pem)?)
    }

    /// From PEM files (see [`ServerTls::from_pem`]).
    ///
    /// # Errors
    /// [`TlsError::Pem`] naming the file when it cannot be read; see [`ServerTls::from_pem`].
    pub fn from_pem_files(chain: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<ServerTls, TlsError> {
        let chain_pem = read_pem("certificate chain", chain.as_ref())?;
        let key_pem = read_pem("private key", key.as_ref())?;
        ServerTls::from_pem(&chain_pem, &key_pem)
    }

    /// Mutual TLS: every client must present a certificate that chains to one of `roots_pem`
    /// (`CERTIFICATE` sections); one without is refused in the TLS handshake (the client's
    /// connect ends UNAUTHENTICATED). Default: no client certificate asked.
    ///
    /// # Errors
    /// [`TlsError::Pem`] when `roots_pem` holds no certificate; [`TlsError::Rustls`] when a root
    /// does not parse.
    pub fn require_client_cert(self, roots_pem: &[u8]) -> Result<ServerTls, TlsError> {
        let roots = root_store("client roots", pem_certs("client roots", roots_pem)?)?;
        let config = Self::build(&self.chain, &self.key, Some(roots))?;
        Ok(ServerTls { config, client_auth: true, ..self })
    }

    /// Whether clients must present a certificate ([`ServerTls::require_client_cert`]).
    pub fn requires_client_cert(&self) -> bool {
        self.client_auth
    }

    fn build(
        chain: &[CertificateDer<'static>],
        key: &PrivateKeyDer<'static>,
        client_roots: Option<RootCertStore>,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls { what: "protocol versions", source })?;
        let builder = match client_roots {
            None => builder.with_no_client_auth(),
            Some(roots) => {
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| TlsError::Rustls {
                            what: "client roots",
                            source: rustls::Error::General(e.to_string()),
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(chain.to_vec(), key.clone_key())
            .map_err(|source| TlsError::Rustls { what: "certificate and key", source })?;
        // One handshake per control connection, never resumed: no tickets (they would arrive
        // after the reply, as bytes the liveness watch drops).
        config.send_tls13_tickets = 0;
        Ok(Arc::new(config))
    }

    /// A server-side TLS connection for one accepted control connection.
    pub(crate) fn accept(&self) -> io::Result<rustls::ServerConnection> {
        rustls::ServerConnection::new(self.config.clone()).map_err(io::Error::other)
    }
}

/// The client's TLS configuration ([`ClientConfig::tls`](crate::ClientConfig::tls)): the roots
/// the server's certificate must chain to, the name it must be valid for, and optionally this
/// client's certificate (for a server with [`ServerTls::require_client_cert`]). Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    roots: Arc<RootCertStore>,
    server_name: ServerName<'static>,
    client_cert: bool,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .field("roots", &self.roots.len())
            .field("client_cert", &self.client_cert)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the DER `roots` and expects the server's certificate to be valid for
    /// `server_name` (a DNS name, or an IP address for a certificate with that IP in its
    /// subject alternative names). It is checked whatever address the client connects to.
    ///
    /// # Errors
    /// [`TlsError::Pem`] for no roots, [`TlsError::Rustls`] for a root that does not parse,
    /// [`TlsError::ServerName`] for a name that is neither a DNS name nor an IP address.
    pub fn new(roots: Vec<CertificateDer<'static>>, server_name: &str) -> Result<ClientTls, TlsError> {
        let roots = Arc::new(root_store("roots", roots)?);
        let server_name = ServerName::try_from(server_name.to_owned())
            .map_err(|_| TlsError::ServerName { name: server_name.to_owned() })?;
        let config = Self::build(&roots, None)?;
        Ok(ClientTls { config, roots, server_name, client_cert: false })
    }

    /// From PEM roots (`CERTIFICATE` sections); see [`ClientTls::new`].
    ///
    /// # Errors
    /// [`TlsError::Pem`] when `roots_pem` holds no certificate; see [`ClientTls::new`].
    pub fn from_pem(roots_pem: &[u8], server_name: &str) -> Result<ClientTls, TlsError> {
        ClientTls::new(pem_certs("roots", roots_pem)?, server_name)
    }

    /// From a PEM file of roots; see [`ClientTls::from_pem`].
    ///
    /// # Errors
    /// [`TlsError::Pem`] naming the file when it cannot be read; see [`ClientTls::from_pem`].
    pub fn from_pem_file(roots: impl AsRef<Path>, server_name: &str) -> Result<ClientTls, TlsError> {
        ClientTls::from_pem(&read_pem("roots", roots.as_ref())?, server_name)
    }

    /// Presents this certificate chain (PEM, this client's certificate first) and key (PEM) to
    /// servers that ask for one (mutual TLS). Default: none presented.
    ///
    /// # Errors
    /// [`TlsError::Pem`] when either holds no usable section; [`TlsError::Rustls`] when rustls
    /// refuses the key.
    pub fn with_client_cert(self, chain_pem: &[u8], key_pem: &[u8]) -> Result<ClientTls, TlsError> {
        let chain = pem_certs("client certificate chain", chain_pem)?;
        let key = pem_key(key_pem)?;
        let config = Self::build(&self.roots, Some((chain, key)))?;
        Ok(ClientTls { config, client_cert: true, ..self })
    }

    /// The name the server's certificate must be valid for.
    pub fn server_name(&self) -> &ServerName<'static> {
        &self.server_name
    }

    fn build(
        roots: &Arc<RootCertStore>,
        cert: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls { what: "protocol versions", source })?
            .with_root_certificates(roots.clone());
        let config = match cert {
            None => builder.with_no_client_auth(),
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|source| TlsError::Rustls { what: "client certificate and key", source })?,
        };
        Ok(Arc::new(config))
    }
}

/// Records the first bytes read from the server (up to one frame), so that a plaintext answer
/// to a TLS client (a refusal from a server without TLS) can be reported.
struct Recorder<'a> {
    tcp: &'a mut TcpStream,
    seen: Vec<u8>,
}

impl Read for Recorder<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.tcp.read(buf)?;
        let room = (3 + MAX_FRAME).saturating_sub(self.seen.len()).min(n);
        self.seen.extend_from_slice(&buf[..room]);
        Ok(n)
    }
}

impl Write for Recorder<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tcp.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// The client's side of the exchange over TLS: the TLS handshake, `hello`, then the server's
/// frame, on a blocking `tcp` whose read and write timeouts bound each step. A TLS failure is
/// the status naming it; I/O failures and timeouts are returned as the frame's error (reported
/// by the caller as without TLS).
pub(crate) fn client_exchange(
    tls: &ClientTls,
    tcp: &mut TcpStream,
    hello: &Frame,
    peer: SocketAddr,
) -> Result<Result<Frame, FrameError>, Status> {
    let mut conn = rustls::ClientConnection::new(tls.config.clone(), tls.server_name.clone())
        .map_err(|e| Status::unavailable(format!("TLS with {peer}: {e}")))?;
    let mut sock = Recorder { tcp, seen: Vec::new() };
    let outcome = {
        let mut stream = rustls::Stream::new(&mut conn, &mut sock);
        match write_frame(&mut stream, hello) {
            Ok(()) => read_frame(&mut stream),
            Err(e) => Err(FrameError::Io(e)),
        }
    };
    match outcome {
        Err(FrameError::Io(e)) => match tls_error(&e) {
            Some(t) => Err(client_tls_status(tls, t, peer, &sock.seen)),
            None if e.kind() == ErrorKind::UnexpectedEof || e.kind() == ErrorKind::ConnectionReset => {
                // A server that refused our certificate may close without an alert reaching us.
                Err(Status::unavailable(format!(
                    "TLS with {peer}: the server closed the connection during the TLS handshake \
                     (does it run with ServerConfig::tls? does it require a client certificate?): {e}"
                )))
            }
            None => Ok(Err(FrameError::Io(e))),
        },
        other => Ok(other),
    }
}

/// The rustls error inside an I/O error, if any.
fn tls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// The status of a failed TLS handshake, seen from the client.
fn client_tls_status(tls: &ClientTls, e: &rustls::Error, peer: SocketAddr, seen: &[u8]) -> Status {
    use rustls::Error as E;
    match e {
        E::InvalidCertificate(c) => {
            let hint = match c {
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                    format!("not valid for the server name {:?} (ClientTls server_name)", tls.server_name)
                }
                CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                    "it does not chain to the trusted roots (ClientTls roots)".to_string()
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "it has expired".into()
                }
                _ => "see the error".into(),
            };
            Status::unauthenticated(format!(
                "TLS with {peer}: the server's certificate is refused: {hint}: {e}"
            ))
        }
        E::AlertReceived(
            a @ (AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateRequired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateExpired
            | AlertDescription::AccessDenied),
        ) => Status::unauthenticated(format!(
            "TLS with {peer}: the server refused this client's certificate (alert {a:?}): it requires \
             one from its client roots (ClientTls::with_client_cert)"
        )),
        E::InvalidMessage(_) | E::InappropriateMessage { .. } | E::PeerMisbehaved(_) if !seen.is_empty() => {
            // Not TLS: a plaintext server answers a ClientHello with a refusal frame.
            let said = match read_frame(&mut &seen[..]) {
                Ok(Frame::Refusal(r)) => format!(": it answered in plaintext: {:?}: {}", r.code, r.message),
                _ => String::new(),
            };
            Status::unavailable(format!(
                "TLS with {peer}: the server does not speak TLS (set ServerConfig::tls there, or unset \
                 ClientConfig::tls here){said}"
            ))
        }
        other => Status::unavailable(format!("TLS with {peer}: {other}")),
    }
}

/// The server side of one control connection's TLS session, held by its
/// [`ControlStream`](crate::control::ControlStream) during the handshake. Reads are nonblocking
/// (the listener's), writes blocking within the write timeout the listener sets. It is dropped
/// with the reply ([`ControlStream::into_tcp`](crate::control::ControlStream::into_tcp)).
pub(crate) struct ServerTlsConn {
    conn: rustls::ServerConnection,
}

impl ServerTlsConn {
    pub(crate) fn new(tls: &ServerTls) -> io::Result<ServerTlsConn> {
        Ok(ServerTlsConn { conn: tls.accept()? })
    }

    /// Reads decrypted bytes without blocking: `WouldBlock` until some arrived, 0 once the peer
    /// closed. Handshake messages due to the peer are written on the way (a socket buffer too
    /// full for them leaves the handshake to its timeout).
    pub(crate) fn read(&mut self, tcp: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            self.flush_nonblocking(tcp)?;
            if self.conn.read_tls(tcp)? == 0 {
                return Ok(0);
            }
            if let Err(e) = self.conn.process_new_packets() {
                // The alert that tells the peer why.
                let _ = self.flush_nonblocking(tcp);
                return Err(io::Error::new(ErrorKind::InvalidData, format!("TLS: {e}")));
            }
        }
    }

    fn flush_nonblocking(&mut self, tcp: &mut TcpStream) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(tcp) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Encrypts `buf` and writes it all (blocking, within the socket's write timeout).
    pub(crate) fn write_all(&mut self, tcp: &mut TcpStream, buf: &[u8]) -> io::Result<()> {
        self.conn.writer().write_all(buf)?;
        while self.conn.wants_write() {
            self.conn.write_tls(tcp)?;
        }
        Ok(())
    }
}
