//! TLS for `https://` OTLP endpoints: rustls with the ring provider, for both transports.
//!
//! What the server is checked against: the CA certificates of `OTEL_EXPORTER_OTLP_CERTIFICATE`
//! (a PEM file) when it is set, else the system's roots (`/etc/ssl/certs`, or `SSL_CERT_FILE` /
//! `SSL_CERT_DIR`, through rustls-native-certs). A client certificate for mutual TLS comes from
//! `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `OTEL_EXPORTER_OTLP_CLIENT_KEY` (PEM; both or
//! neither). The `TRACES_` forms of the three variables come first, as for the others. The files
//! are read once, when the exporter is configured, so a missing or unreadable file is an error at
//! start-up, not a stream of failed exports.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::error::OtlpError;

/// The PEM material of the TLS settings, read from their files.
#[derive(Clone, Default)]
pub struct TlsPem {
    /// CA certificates (`…_CERTIFICATE`); `None`: the system's roots.
    pub ca: Option<Vec<u8>>,
    /// Client certificate chain and its key (`…_CLIENT_CERTIFICATE`, `…_CLIENT_KEY`).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsPem {
    // The key is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPem")
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl TlsPem {
    /// Reads the files the variables name (`var` gives a variable's value, `TRACES_` form
    /// first). Certificates and keys are parsed here too, so that a wrong file is an error
    /// now.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, OtlpError> {
        let read = |name: &'static str| -> Result<Option<Vec<u8>>, OtlpError> {
            let Some(path) = var(name) else {
                return Ok(None);
            };
            let path = path.trim();
            std::fs::read(path)
                .map(Some)
                .map_err(|e| OtlpError::Setting(setting(name), format!("{path}: {e}")))
        };
        let ca = read("CERTIFICATE")?;
        let cert = read("CLIENT_CERTIFICATE")?;
        let client_key = read("CLIENT_KEY")?;
        let client = match (cert, client_key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Err(OtlpError::Setting(
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    "a client certificate needs its key (OTEL_EXPORTER_OTLP_CLIENT_KEY) and the key its certificate".into(),
                ))
            }
        };
        let pem = Self { ca, client };
        if let Some(ca) = &pem.ca {
            certificates(ca, "OTEL_EXPORTER_OTLP_CERTIFICATE")?;
        }
        if let Some((c, k)) = &pem.client {
            certificates(c, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")?;
            key(k)?;
        }
        Ok(pem)
    }

    /// The rustls client configuration for HTTP/1.1 over TLS (no ALPN: the connector sets it).
    pub(super) fn http_config(&self) -> Result<rustls::ClientConfig, OtlpError> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some(ca) => {
                for c in certificates(ca, "OTEL_EXPORTER_OTLP_CERTIFICATE")? {
                    roots.add(c).map_err(|e| {
                        OtlpError::Setting("OTEL_EXPORTER_OTLP_CERTIFICATE", e.to_string())
                    })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for c in found.certs {
                    // One unusable system certificate does not stop the others.
                    let _ = roots.add(c);
                }
                if roots.is_empty() {
                    return Err(OtlpError::Setting(
                        "OTEL_EXPORTER_OTLP_CERTIFICATE",
                        "no CA certificates on this system: name the CA's PEM file in OTEL_EXPORTER_OTLP_CERTIFICATE".into(),
                    ));
                }
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| OtlpError::Setting("TLS", e.to_string()))?
        .with_root_certificates(roots);
        // ALPN (`http/1.1`) is set by hyper-rustls's builder, which requires it empty here.
        let config = match &self.client {
            Some((c, k)) => builder
                .with_client_auth_cert(
                    certificates(c, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")?,
                    key(k)?,
                )
                .map_err(|e| OtlpError::Setting("OTEL_EXPORTER_OTLP_CLIENT_KEY", e.to_string()))?,
            None => builder.with_no_client_auth(),
        };
        Ok(config)
    }

    /// tonic's TLS settings for gRPC over TLS (HTTP/2).
    pub(super) fn grpc_config(&self) -> tonic::transport::ClientTlsConfig {
        let mut tls = tonic::transport::ClientTlsConfig::new().assume_http2(true);
        tls = match &self.ca {
            Some(ca) => tls.ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            None => tls.with_native_roots(),
        };
        if let Some((c, k)) = &self.client {
            tls = tls.identity(tonic::transport::Identity::from_pem(c, k));
        }
        tls
    }
}

/// The variable's name for an error message.
fn setting(name: &str) -> &'static str {
    match name {
        "CERTIFICATE" => "OTEL_EXPORTER_OTLP_CERTIFICATE",
        "CLIENT_CERTIFICATE" => "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        _ => "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    }
}

/// Every certificate of a PEM file; at least one.
fn certificates(pem: &[u8], name: &'static str) -> Result<Vec<CertificateDer<'static>>, OtlpError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| OtlpError::Setting(name, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(OtlpError::Setting(
            name,
            "no certificate in the file".into(),
        ));
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
fn key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, OtlpError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        OtlpError::Setting(
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            format!("no private key: {e}"),
        )
    })
}
