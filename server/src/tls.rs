//! TLS for both surfaces of `leaseline serve`, from PEM files that can be
//! replaced while the server runs.
//!
//! - The certificate chain and its private key (PKCS#8, PKCS#1 or SEC1)
//!   are read from two PEM files. [`Tls::reload`] reads them again (the
//!   binary calls it on SIGHUP): connections accepted afterwards get the
//!   new certificate, open ones keep theirs, and files that do not load
//!   leave the previous certificate in place.
//! - HTTP may also require client certificates signed by a CA of its own
//!   (mutual TLS); a client without one fails the handshake.
//! - When TLS is configured nothing is served in plaintext. HTTP: a
//!   request that is not a TLS handshake gets one plaintext `400` saying
//!   to use `https://`, and the connection is closed. PostgreSQL (see
//!   [`pg_gate`]): the client's `SSLRequest` is answered `S` and the
//!   connection upgraded; a startup message sent without one gets
//!   `FATAL 28000` and the connection is closed, so no client is
//!   downgraded to plaintext by a `sslmode=prefer` or by a middlebox.
//!
//! The crypto provider is rustls's `ring`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

/// Where the certificate, its key and the client CA come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first (PEM).
    pub cert: PathBuf,
    /// The leaf's private key (PEM).
    pub key: PathBuf,
    /// CA certificates that sign the client certificates HTTP requires;
    /// `None`: HTTP asks for none.
    pub http_client_ca: Option<PathBuf>,
}

/// The current server configurations of both surfaces; see the module
/// documentation.
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Current>,
}

#[derive(Clone)]
struct Current {
    http: Arc<ServerConfig>,
    pg: Arc<ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

/// The application protocols each surface names in ALPN. PostgreSQL 17's
/// direct TLS (`sslnegotiation=direct`) requires `postgresql`.
const HTTP_ALPN: &[u8] = b"http/1.1";
const PG_ALPN: &[u8] = b"postgresql";

impl Tls {
    /// Reads the files; the error names the file at fault and why, never
    /// its content.
    pub fn load(files: TlsFiles) -> Result<Tls, String> {
        let current = Current::load(&files)?;
        Ok(Tls {
            files,
            current: RwLock::new(current),
        })
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Reads the files again. On error the previous certificate stays in
    /// use and the error says why.
    pub fn reload(&self) -> Result<(), String> {
        let fresh = Current::load(&self.files)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    fn current(&self) -> Current {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Accepts one HTTP connection with the current certificate.
    pub fn http_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current().http)
    }

    /// Accepts one PostgreSQL connection with the current certificate.
    pub fn pg_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current().pg)
    }
}

impl Current {
    fn load(files: &TlsFiles) -> Result<Current, String> {
        let certs = read_certs(&files.cert, "serve.tls_cert_file")?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
            format!(
                "serve.tls_key_file {}: no private key read: {e}",
                files.key.display()
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = || {
            ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())
        };
        let http = match &files.http_client_ca {
            None => builder()?.with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                let (added, _) =
                    roots.add_parsable_certificates(read_certs(path, "serve.http_client_ca_file")?);
                if added == 0 {
                    return Err(format!(
                        "serve.http_client_ca_file {}: no usable CA certificate",
                        path.display()
                    ));
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| {
                            format!("serve.http_client_ca_file {}: {e}", path.display())
                        })?;
                builder()?.with_client_cert_verifier(verifier)
            }
        };
        // rustls checks that the key belongs to the leaf certificate.
        let mismatch = |e: rustls::Error| {
            format!(
                "serve.tls_cert_file {} with serve.tls_key_file {}: {e}",
                files.cert.display(),
                files.key.display()
            )
        };
        let mut http = http
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(mismatch)?;
        http.alpn_protocols = vec![HTTP_ALPN.to_vec()];
        let mut pg = builder()?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(mismatch)?;
        pg.alpn_protocols = vec![PG_ALPN.to_vec()];
        Ok(Current {
            http: Arc::new(http),
            pg: Arc::new(pg),
        })
    }
}

fn read_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{key} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{key} {}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// The first byte of every TLS handshake (a handshake record).
pub const TLS_HANDSHAKE: u8 = 0x16;

/// Request codes of the 8-byte (16 for a cancel) messages a PostgreSQL
/// client may open with, where a startup message has its protocol version.
const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;
const CANCEL_REQUEST: u32 = 80877102;

/// What a PostgreSQL connection to a TLS server may do next.
#[derive(Debug, PartialEq, Eq)]
pub enum PgGate {
    /// Hand it to pgwire with the TLS acceptor: it asked for TLS (an
    /// `SSLRequest`, or a TLS handshake straight away), or it is a
    /// `CancelRequest`, which PostgreSQL also takes in plaintext (it
    /// carries nothing but the key of the query to cancel).
    Proceed,
    /// A plaintext startup message: answered with FATAL 28000 and closed.
    Refused,
    /// The client closed without a whole first message.
    Closed,
}

/// What pgwire's `process_socket` is to take for a new PostgreSQL
/// connection: `Some(None)` without TLS configured, `Some(acceptor)` with
/// it, and `None` when the connection was answered and closed here (see
/// [`pg_gate`]), or did not send its first message `within`.
pub async fn pg_accept(
    tls: Option<&Tls>,
    socket: &mut TcpStream,
    peer: std::net::SocketAddr,
    within: Duration,
) -> Option<Option<TlsAcceptor>> {
    let Some(tls) = tls else {
        return Some(None);
    };
    match tokio::time::timeout(within, pg_gate(socket)).await {
        Ok(Ok(PgGate::Proceed)) => Some(Some(tls.pg_acceptor())),
        Ok(Ok(PgGate::Refused)) => {
            tracing::info!(%peer, "postgres connection refused: plaintext startup while TLS is required");
            None
        }
        Ok(Ok(PgGate::Closed)) | Err(_) => None,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "postgres connection failed");
            None
        }
    }
}

/// Looks at a new PostgreSQL connection's first message when TLS is
/// required, without consuming what pgwire must read. A `GSSENCRequest`
/// (libpq sends one first when it holds Kerberos credentials) is declined
/// with `N`, as PostgreSQL does, and the next message looked at. A
/// plaintext startup message is read and answered with `FATAL 28000`.
pub async fn pg_gate(socket: &mut TcpStream) -> std::io::Result<PgGate> {
    loop {
        let mut head = [0u8; 8];
        let n = peek_up_to(socket, &mut head).await?;
        if n >= 1 && head[0] == TLS_HANDSHAKE {
            return Ok(PgGate::Proceed);
        }
        if n < head.len() {
            return Ok(PgGate::Closed);
        }
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        match u32::from_be_bytes([head[4], head[5], head[6], head[7]]) {
            SSL_REQUEST | CANCEL_REQUEST => return Ok(PgGate::Proceed),
            GSSENC_REQUEST => {
                socket.read_exact(&mut head).await?;
                socket.write_all(b"N").await?;
            }
            _ => {
                // Read the startup message before answering: closing a
                // socket with unread data resets it, and the client would
                // see a dropped connection instead of the reason.
                let mut rest = vec![0u8; len.clamp(8, 10_000)];
                let _ = socket.read(&mut rest).await?;
                socket
                    .write_all(&crate::pg::fatal(
                        "28000", // invalid_authorization_specification, as pg_hba's hostssl
                        "this server requires TLS: connect with sslmode=require, verify-ca or \
                         verify-full (serve.tls_cert_file is set, so plaintext is refused)",
                    ))
                    .await?;
                socket.shutdown().await?;
                return Ok(PgGate::Refused);
            }
        }
    }
}

/// Peeks until `buf` is full or the peer has closed; returns how many
/// bytes are there.
async fn peek_up_to(socket: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        let n = socket.peek(buf).await?;
        if n == 0 || n == buf.len() {
            return Ok(n);
        }
        // Clients send their first message in one write, so this is a
        // rare split packet. A peek returns at once while any byte is
        // buffered, so wait a little for the rest instead of spinning;
        // the caller bounds the whole wait.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_file_is_named_and_its_content_never_shown() {
        let dir = std::env::temp_dir().join(format!("leaseline-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        std::fs::write(&cert, "not a certificate").unwrap();
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n").unwrap();
        let files = TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            http_client_ca: None,
        };
        let err = Tls::load(files.clone()).unwrap_err();
        assert_eq!(
            err,
            format!(
                "serve.tls_cert_file {}: no certificate in it",
                cert.display()
            )
        );
        let missing = TlsFiles {
            cert: dir.join("absent.pem"),
            ..files
        };
        let err = Tls::load(missing).unwrap_err();
        assert!(err.starts_with("serve.tls_cert_file "), "{err}");
        assert!(err.contains("absent.pem"), "{err}");
        assert!(!err.contains("c2VjcmV0"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
