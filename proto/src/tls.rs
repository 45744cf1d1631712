//! Optional TLS for every Lode connection: the dispatcher's gRPC port and the receiver's port
//! (gRPC and the data plane). rustls with the ring provider, set on each config rather than
//! installed process-wide, through tokio-rustls; tonic's own TLS is not used.
//!
//! # The scheme decides
//! An address `https://host:port` is reached over TLS, `http://host:port` or a bare
//! `host:port` in plaintext. A client asked to reach an https address without a CA
//! certificate fails ([`DialError::NoCa`]) rather than fall back to plaintext; a client that
//! has a CA but is given an http address connects in plaintext and logs a warning (the server
//! decides what it serves; a TLS server refuses it). The server's certificate is checked
//! against the address's host (DNS name or IP literal, which must be among its SANs).
//!
//! # Servers
//! A server with a [`ServerTls`] takes only TLS: every accepted connection must complete a
//! handshake within [`HANDSHAKE_TIMEOUT`] before a byte of it reaches gRPC or the data plane;
//! one that does not (a plaintext client, a wrong CA on the other side) is logged and closed.
//! The server offers ALPN `h2`; a data-plane client offers no ALPN at all.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// How long a TLS handshake may take, on either side.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The ALPN name of HTTP/2, which gRPC needs negotiated over TLS.
const ALPN_H2: &[u8] = b"h2";

/// Why a certificate, key or CA file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: cannot read the {what} file: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: the {what} file is not valid PEM: {reason}", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{}: no certificate in the {what} file (expected a PEM `BEGIN CERTIFICATE` block)", path.display())]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("{}: no private key in the key file (expected a PEM `BEGIN PRIVATE KEY`, `BEGIN EC PRIVATE KEY` or `BEGIN RSA PRIVATE KEY` block)", path.display())]
    NoPrivateKey { path: PathBuf },
    #[error("{}: the private key does not match the certificate in {}", key.display(), cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("{} with {}: not a usable server identity: {source}", cert.display(), key.display())]
    ServerIdentity {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("{}: not a usable CA certificate: {source}", path.display())]
    BadCa {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot set up TLS with the ring provider: {source}")]
    Provider {
        #[source]
        source: rustls::Error,
    },
}

/// Why a client could not open a connection.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("{addr} is an https address, but no CA certificate was given to check its server's certificate (--tls-ca FILE)")]
    NoCa { addr: String },
    #[error(
        "{addr}: {host:?} is not a name or IP address a TLS certificate can be checked against"
    )]
    ServerName { addr: String, host: String },
    #[error("cannot reach {addr}")]
    Unreachable {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("TLS handshake with {addr} failed")]
    Handshake {
        addr: String,
        #[source]
        source: io::Error,
    },
}

impl DialError {
    /// Whether the peer was not up or went away (worth retrying), rather than refused what
    /// this client is (a certificate it does not trust, no CA, a bad address).
    pub fn is_unreachable(&self) -> bool {
        match self {
            DialError::Unreachable { .. } => true,
            DialError::Handshake { source, .. } => !is_tls_failure(source),
            DialError::NoCa { .. } | DialError::ServerName { .. } => false,
        }
    }
}

/// Whether an I/O error of a TLS stream is TLS refusing something (not the network).
fn is_tls_failure(err: &io::Error) -> bool {
    err.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in a PEM file; at least one.
fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read("key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            path: path.to_owned(),
        },
        other => TlsError::Pem {
            what: "key",
            path: path.to_owned(),
            reason: other.to_string(),
        },
    })
}

/// A server's TLS identity: its certificate chain and private key. Cheap to clone.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: TlsAcceptor,
    cert: Arc<Path>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads a PEM certificate chain (the server's certificate first) and its PEM private
    /// key (PKCS#8, SEC1 or PKCS#1). The error names the file and what is wrong with it.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<ServerTls, TlsError> {
        let chain = certificates("certificate", cert)?;
        let secret = private_key(key)?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Provider { source })?
            .with_no_client_auth()
            .with_single_cert(chain, secret)
            .map_err(|source| match source {
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                    TlsError::KeyMismatch {
                        cert: cert.to_owned(),
                        key: key.to_owned(),
                    }
                }
                source => TlsError::ServerIdentity {
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                    source,
                },
            })?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(ServerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            cert: cert.into(),
        })
    }

    /// Completes the server side of a handshake on an accepted connection, within
    /// [`HANDSHAKE_TIMEOUT`]. A peer whose first bytes are a plaintext HTTP/2 preface or a
    /// data-plane hello (a client given an `http://` address) is kept as
    /// [`MaybeTls::PlainOnTlsPort`]: served only to be told, in its own protocol, that this
    /// port takes TLS ([`refuse_plaintext`], the data plane's refusal).
    pub async fn accept(&self, stream: TcpStream) -> io::Result<ServerStream> {
        let mut head = [0u8; 4];
        let peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, peek_exact(&stream, &mut head)).await;
        if matches!(peeked, Ok(Ok(true))) && PLAINTEXT_HEADS.contains(&head) {
            return Ok(MaybeTls::PlainOnTlsPort(stream));
        }
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(stream)).await {
            Ok(Ok(tls)) => Ok(MaybeTls::Tls(Box::new(tls))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no TLS handshake within {} s", HANDSHAKE_TIMEOUT.as_secs()),
            )),
        }
    }
}

/// The first bytes of the plaintext protocols a TLS port recognises to refuse them clearly:
/// HTTP/2's connection preface (`PRI * HTTP/2.0`, gRPC) and the data plane's hello. A TLS
/// handshake starts with a record of type 22 instead.
const PLAINTEXT_HEADS: [[u8; 4]; 2] = [*b"PRI ", *b"LODP"];

/// Waits for the first `head.len()` bytes of `stream` without consuming them; false if the
/// peer closed first.
pub async fn peek_exact(stream: &TcpStream, head: &mut [u8]) -> io::Result<bool> {
    loop {
        let n = stream.peek(head).await?;
        if n == 0 {
            return Ok(false);
        }
        if n >= head.len() {
            return Ok(true);
        }
        // Fewer bytes than asked for so far: wait for the rest.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// What a server knows of a connection a request came on (tonic puts it in the request's
/// extensions).
#[derive(Debug, Clone)]
pub struct ServerConnectInfo {
    pub tcp: TcpConnectInfo,
    /// A plaintext client on a port that serves TLS only.
    pub plaintext_on_tls_port: bool,
}

/// The peer a request came from.
pub fn peer<T>(request: &tonic::Request<T>) -> Option<std::net::SocketAddr> {
    request
        .extensions()
        .get::<ServerConnectInfo>()
        .and_then(|info| info.tcp.remote_addr())
}

/// Refuses a request that came in plaintext to a port that serves TLS only, before anything
/// else looks at it, saying how to reach the port.
#[allow(clippy::result_large_err)] // tonic's handlers answer with a `Status` as it is
pub fn refuse_plaintext<T>(request: &tonic::Request<T>) -> Result<(), tonic::Status> {
    let Some(info) = request.extensions().get::<ServerConnectInfo>() else {
        return Ok(());
    };
    if !info.plaintext_on_tls_port {
        return Ok(());
    }
    Err(tonic::Status::failed_precondition(plaintext_refusal(
        info.tcp.local_addr(),
    )))
}

/// Why a plaintext client is refused by a TLS-only port at `local`.
pub fn plaintext_refusal(local: Option<std::net::SocketAddr>) -> String {
    let addr = local.map_or_else(|| "host:port".to_owned(), |a| a.to_string());
    format!(
        "this port serves TLS only: dial https://{addr} with --tls-ca FILE (the request came in \
         plaintext and was not processed)"
    )
}

/// What a client connection carries: gRPC negotiates HTTP/2 by ALPN; the data plane offers
/// no ALPN (the receiver tells it from gRPC by its first bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    DataPlane,
}

/// A client's trust: the CA certificates that may sign the servers' certificates. Cheap to
/// clone.
#[derive(Clone)]
pub struct ClientTls {
    grpc: TlsConnector,
    data_plane: TlsConnector,
    ca: Arc<Path>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the CA certificates in a PEM file (one or more).
    pub fn from_ca_file(ca: &Path) -> Result<ClientTls, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates("CA certificate", ca)? {
            roots.add(cert).map_err(|source| TlsError::BadCa {
                path: ca.to_owned(),
                source,
            })?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Provider { source })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut grpc = config.clone();
        grpc.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(ClientTls {
            grpc: TlsConnector::from(Arc::new(grpc)),
            data_plane: TlsConnector::from(Arc::new(config)),
            ca: ca.into(),
        })
    }
}

/// The address clients dial for a server at `host_port`: `https://` when it serves TLS,
/// `http://` otherwise (the scheme rule, see the module doc).
pub fn url(host_port: impl fmt::Display, tls: bool) -> String {
    format!("{}://{host_port}", if tls { "https" } else { "http" })
}

/// Whether `addr` names a TLS server (`https://`).
pub fn is_https(addr: &str) -> bool {
    addr.starts_with("https://")
}

/// The trust to reach `addr` with, by the scheme rule (see the module doc): `None` for
/// plaintext, an error for an https address without a CA.
pub fn trust_for<'a>(
    addr: &str,
    tls: Option<&'a ClientTls>,
) -> Result<Option<&'a ClientTls>, DialError> {
    match (is_https(addr), tls) {
        (true, Some(tls)) => Ok(Some(tls)),
        (true, None) => Err(DialError::NoCa {
            addr: addr.to_owned(),
        }),
        (false, Some(_)) => {
            tracing::warn!(%addr, "a CA is configured, but the address is not https: connecting in plaintext");
            Ok(None)
        }
        (false, None) => Ok(None),
    }
}

/// `host:port` of an address (`https://host:port`, `http://host:port` or `host:port`).
pub fn host_port(addr: &str) -> &str {
    let rest = addr
        .strip_prefix("http://")
        .or_else(|| addr.strip_prefix("https://"))
        .unwrap_or(addr);
    rest.trim_end_matches('/')
}

/// The host of `host:port` without IPv6 brackets.
fn host_of(host_port: &str) -> &str {
    let host = host_port
        .rsplit_once(':')
        .map_or(host_port, |(host, _port)| host);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// Opens a connection to `addr`: TCP (no Nagle delay), then TLS when the scheme asks for it
/// (see [`trust_for`]), checking the server's certificate against the address's host.
pub async fn dial(
    addr: &str,
    tls: Option<&ClientTls>,
    protocol: Protocol,
) -> Result<ClientStream, DialError> {
    let trust = trust_for(addr, tls)?;
    let target = host_port(addr);
    let unreachable = |source| DialError::Unreachable {
        addr: addr.to_owned(),
        source,
    };
    let tcp = TcpStream::connect(target).await.map_err(unreachable)?;
    tcp.set_nodelay(true).map_err(unreachable)?;
    let Some(trust) = trust else {
        return Ok(MaybeTls::Plain(tcp));
    };
    let host = host_of(target);
    let name = ServerName::try_from(host.to_owned()).map_err(|_| DialError::ServerName {
        addr: addr.to_owned(),
        host: host.to_owned(),
    })?;
    let connector = match protocol {
        Protocol::Grpc => &trust.grpc,
        Protocol::DataPlane => &trust.data_plane,
    };
    let handshake = |source| DialError::Handshake {
        addr: addr.to_owned(),
        source,
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, tcp)).await {
        Ok(Ok(stream)) => Ok(MaybeTls::Tls(Box::new(stream))),
        Ok(Err(e)) => Err(handshake(e)),
        Err(_) => Err(handshake(io::ErrorKind::TimedOut.into())),
    }
}

/// A TCP connection, in plaintext or inside TLS.
#[derive(Debug)]
pub enum MaybeTls<T> {
    Plain(TcpStream),
    Tls(Box<T>),
    /// A plaintext client on a server's TLS-only port (see [`ServerTls::accept`]); never a
    /// client's connection.
    PlainOnTlsPort(TcpStream),
}

/// A server's accepted connection.
pub type ServerStream = MaybeTls<tokio_rustls::server::TlsStream<TcpStream>>;

/// A client's connection.
pub type ClientStream = MaybeTls<tokio_rustls::client::TlsStream<TcpStream>>;

impl<T> MaybeTls<T> {
    pub fn is_tls(&self) -> bool {
        matches!(self, MaybeTls::Tls(_))
    }
}

impl ServerStream {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            MaybeTls::Plain(tcp) | MaybeTls::PlainOnTlsPort(tcp) => tcp,
            MaybeTls::Tls(tls) => tls.get_ref().0,
        }
    }
}

impl ClientStream {
    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            MaybeTls::Plain(tcp) | MaybeTls::PlainOnTlsPort(tcp) => tcp,
            MaybeTls::Tls(tls) => tls.get_ref().0,
        }
    }
}

impl Connected for ServerStream {
    type ConnectInfo = ServerConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ServerConnectInfo {
            tcp: self.tcp().connect_info(),
            plaintext_on_tls_port: matches!(self, MaybeTls::PlainOnTlsPort(_)),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for MaybeTls<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) | MaybeTls::PlainOnTlsPort(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for MaybeTls<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) | MaybeTls::PlainOnTlsPort(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) | MaybeTls::PlainOnTlsPort(s) => {
                Pin::new(s).poll_write_vectored(cx, bufs)
            }
            MaybeTls::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) | MaybeTls::PlainOnTlsPort(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) | MaybeTls::PlainOnTlsPort(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) | MaybeTls::PlainOnTlsPort(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// The test certificates in `proto/testdata/tls/` (see its README: test-only keys).
#[cfg(test)]
pub(crate) fn testdata(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/tls")
        .join(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(cert: &str, key: &str) -> Result<ServerTls, TlsError> {
        ServerTls::from_pem_files(&testdata(cert), &testdata(key))
    }

    #[test]
    fn the_test_certificates_load() {
        server("server.crt", "server.key").expect("server identity");
        ClientTls::from_ca_file(&testdata("ca.crt")).expect("CA");
        ClientTls::from_ca_file(&testdata("other-ca.crt")).expect("other CA");
    }

    #[test]
    fn loader_errors_name_the_file_and_what_is_wrong() {
        let tmp = tempfile::tempdir().expect("tmp");
        let garbage = tmp.path().join("garbage.pem");
        std::fs::write(&garbage, "not pem at all\n").expect("write");
        let broken = tmp.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END PRIVATE KEY-----\n",
        )
        .expect("write");
        let missing = tmp.path().join("missing.crt");
        let path = |p: &Path| p.display().to_string();

        let cases: Vec<(Result<ServerTls, TlsError>, String, &str)> = vec![
            (
                ServerTls::from_pem_files(&missing, &testdata("server.key")),
                path(&missing),
                "cannot read the certificate file",
            ),
            (
                ServerTls::from_pem_files(&testdata("server.crt"), &missing),
                path(&missing),
                "cannot read the key file",
            ),
            (
                // A key where the certificate belongs.
                server("server.key", "server.key"),
                path(&testdata("server.key")),
                "no certificate in the certificate file",
            ),
            (
                // A certificate where the key belongs.
                server("server.crt", "server.crt"),
                path(&testdata("server.crt")),
                "no private key",
            ),
            (
                ServerTls::from_pem_files(&garbage, &testdata("server.key")),
                path(&garbage),
                "no certificate",
            ),
            (
                ServerTls::from_pem_files(&broken, &testdata("server.key")),
                path(&broken),
                "not valid PEM",
            ),
            (
                // The CA's key with the server's certificate.
                server("server.crt", "ca.key"),
                path(&testdata("ca.key")),
                "does not match the certificate",
            ),
        ];
        for (result, file, why) in cases {
            let err = result.expect_err(why).to_string();
            assert!(err.contains(&file) && err.contains(why), "{why}: {err}");
        }

        for (ca, why) in [
            (&missing, "cannot read the CA certificate file"),
            (&garbage, "no certificate in the CA certificate file"),
        ] {
            let err = ClientTls::from_ca_file(ca).expect_err(why).to_string();
            assert!(err.contains(&path(ca)) && err.contains(why), "{why}: {err}");
        }
        let key_as_ca = ClientTls::from_ca_file(&testdata("ca.key"))
            .expect_err("a key is no CA")
            .to_string();
        assert!(key_as_ca.contains("no certificate"), "{key_as_ca}");
    }

    #[test]
    fn the_scheme_decides() {
        let tls = ClientTls::from_ca_file(&testdata("ca.crt")).expect("CA");
        assert!(trust_for("https://127.0.0.1:1", Some(&tls))
            .expect("trust")
            .is_some());
        assert!(trust_for("http://127.0.0.1:1", Some(&tls))
            .expect("plaintext")
            .is_none());
        assert!(trust_for("127.0.0.1:1", None).expect("plaintext").is_none());
        let err = trust_for("https://127.0.0.1:1", None).expect_err("no CA");
        assert!(!err.is_unreachable());
        let text = err.to_string();
        assert!(
            text.contains("https://127.0.0.1:1") && text.contains("--tls-ca"),
            "{text}"
        );
        assert_eq!(host_of("127.0.0.1:9"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9"), "::1");
        assert_eq!(host_of("localhost:9"), "localhost");
        assert_eq!(host_port("https://h:1/"), "h:1");
    }
}
