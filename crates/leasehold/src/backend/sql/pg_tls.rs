//! TLS to PostgreSQL (features `tls` and `postgres`): tokio-postgres's TLS hooks on the rustls that the `tls` feature
//! builds (ring), with the [`Builder`](crate::Builder)'s CA and client identity, or the system's trust store.
//!
//! Used only when the URL says `sslmode=require`: the server's certificate is then always verified, for the host the
//! URL names. `sslmode=prefer` (tokio-postgres's default) stays in the clear, since a verifying `prefer` would refuse
//! the self-signed certificates many servers run with, and a non-verifying one protects nothing.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use crate::backend::tls::{ensure_crypto_provider, TlsSettings};
use crate::error::InvalidArgument;

/// Makes a verifying TLS connection per PostgreSQL connection.
#[derive(Clone)]
pub(crate) struct MakeRustls {
    config: Arc<rustls::ClientConfig>,
}

impl MakeRustls {
    /// A connector trusting `settings`' CA (the system's trust store without one), presenting its client identity
    /// when it has one.
    pub(crate) fn new(settings: &TlsSettings) -> Result<MakeRustls, InvalidArgument> {
        ensure_crypto_provider();
        let bad = |why: String| InvalidArgument::BadTls(why);
        let mut roots = rustls::RootCertStore::empty();
        match &settings.ca {
            Some(ca) => {
                for cert in CertificateDer::pem_slice_iter(ca) {
                    let cert = cert.map_err(|e| bad(format!("the CA PEM cannot be read ({e})")))?;
                    roots
                        .add(cert)
                        .map_err(|e| bad(format!("the CA certificate is not usable ({e})")))?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    // A system certificate rustls cannot use is skipped, as redis-rs does.
                    let _ = roots.add(cert);
                }
            }
        }
        if roots.is_empty() {
            return Err(bad("no CA certificate to verify the server with".to_owned()));
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let config = match &settings.identity {
            Some((cert, key)) => {
                let certs = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad(format!("the client certificate PEM cannot be read ({e})")))?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                    bad(format!(
                        "the client key PEM holds no usable private key ({e})"
                    ))
                })?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| bad(format!("the client identity is not usable ({e})")))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(MakeRustls {
            config: Arc::new(config),
        })
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let name = ServerName::try_from(domain.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(RustlsConnect {
            connector: tokio_rustls::TlsConnector::from(Arc::clone(&self.config)),
            name,
        })
    }
}

/// One connection's TLS handshake.
pub(crate) struct RustlsConnect {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let stream = self.connector.connect(self.name, stream).await?;
            Ok(RustlsStream(Box::new(stream)))
        })
    }
}

/// A TLS stream to PostgreSQL.
pub(crate) struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // No channel binding: SCRAM runs without `-PLUS`, as libpq does by default (`channel_binding=prefer`
        // falls back the same way).
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}
