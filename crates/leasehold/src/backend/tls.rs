//! TLS (`rediss://`): the crypto backend, a private CA and a client identity for mutual TLS.
//!
//! redis-rs does the TLS through rustls. Two things make that usable out of the box:
//! - rustls needs a process-wide crypto provider, and panics at the first connection when it cannot pick one. The
//!   client installs ring's as the process default when no provider is installed yet (an application that installed
//!   its own, aws-lc-rs say, keeps it).
//! - a private CA or a client certificate has to be given to redis-rs when its client is built, as PEM. The
//!   [`Builder`](crate::Builder) takes them as PEM bytes and checks them before connecting, so that a wrong file is
//!   reported as [`InvalidArgument::BadTls`] rather than as a handshake failure.
//!
//! Without a CA, the server certificate is checked against the system's trust store (what `openssl` and
//! `redis-cli --tls` use). `rediss://host/#insecure` skips the check entirely (testing only).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::InvalidArgument;

/// Certificates given to the builder, as PEM.
#[derive(Default, Clone)]
pub(crate) struct TlsSettings {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsSettings {
    pub(crate) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.identity.is_none()
    }
}

/// Installs ring as rustls's process-wide provider unless one is installed already.
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race against another installer is fine: a provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// `redis` rebuilt with the certificates of `settings` (unchanged when there are none).
pub(crate) fn apply(
    redis: redis::Client,
    settings: &TlsSettings,
) -> Result<redis::Client, InvalidArgument> {
    let info = redis.get_connection_info().clone();
    let uses_tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    match checked(settings, uses_tls)? {
        None => Ok(redis),
        Some(certs) => redis::Client::build_with_tls(info, certs)
            .map_err(|e| InvalidArgument::BadTls(e.to_string())),
    }
}

/// The certificates of `settings`, checked, for servers reached with TLS (`uses_tls`); `None` when there are none.
pub(crate) fn checked(
    settings: &TlsSettings,
    uses_tls: bool,
) -> Result<Option<redis::TlsCertificates>, InvalidArgument> {
    if settings.is_empty() {
        return Ok(None);
    }
    if !uses_tls {
        return Err(InvalidArgument::BadTls(
            "TLS certificates were given for a URL that does not use TLS (use rediss://)"
                .to_owned(),
        ));
    }
    if let Some(ca) = &settings.ca {
        let count = certificates(ca, "CA")?;
        if count == 0 {
            return Err(InvalidArgument::BadTls(
                "the CA PEM holds no certificate".to_owned(),
            ));
        }
    }
    if let Some((cert, key)) = &settings.identity {
        if certificates(cert, "client certificate")? == 0 {
            return Err(InvalidArgument::BadTls(
                "the client certificate PEM holds no certificate".to_owned(),
            ));
        }
        PrivateKeyDer::from_pem_slice(key).map_err(|e| {
            InvalidArgument::BadTls(format!(
                "the client key PEM holds no usable private key ({e})"
            ))
        })?;
    }
    Ok(Some(redis::TlsCertificates {
        client_tls: settings
            .identity
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: settings.ca.clone(),
    }))
}

/// How many certificates `pem` holds; an error when one of them cannot be read.
fn certificates(pem: &[u8], what: &str) -> Result<usize, InvalidArgument> {
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| InvalidArgument::BadTls(format!("the {what} PEM cannot be read ({e})")))?;
        count += 1;
    }
    Ok(count)
}
