//! What can keep the OTLP exporter from starting: a bad endpoint or setting (TLS files
//! included, `tls.rs`), or its thread not starting.

#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("OTLP endpoint {0:?}: {1}")]
    Endpoint(String, String),
    #[error("{0}: {1}")]
    Setting(&'static str, String),
    #[error("OTLP exporter: {0}")]
    Start(#[from] std::io::Error),
}
