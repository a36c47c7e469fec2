//! Where and how spans are exported: `--otlp` and the standard `OTEL_EXPORTER_OTLP_*`
//! variables read into an [`OtlpConfig`] (docs/otlp.md, "Settings").
use std::time::Duration;

use super::{error::OtlpError, spans::SpanConfig, tls::TlsPem};

/// How spans are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`: POST to `…/v1/traces`.
    HttpProtobuf,
    /// `grpc`: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.
    Grpc,
}

/// Where and how to export, and what.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// The full URL: for HTTP the `/v1/traces` URL, for gRPC the server's.
    pub endpoint: String,
    pub protocol: Protocol,
    pub headers: Vec<(String, String)>,
    /// Per request.
    pub timeout: Duration,
    pub gzip: bool,
    /// Ratio of traces kept (by trace id); failing and slow ones are always kept.
    pub sample: f64,
    /// Transactions at least this slow are always kept.
    pub slow_ns: u64,
    pub spans: SpanConfig,
    /// Transactions waiting to be exported; beyond, new ones are dropped and counted.
    pub queue: usize,
    /// Bytes of the transactions waiting or being sent (as `export::record_bytes` counts
    /// them); beyond, new ones are dropped and counted as with a full queue. Bounds the
    /// memory the exporter holds while the backend is down, whatever the transactions' size
    /// (a loop's have 64 legs of up to 64 hops): the spans and the encoded request of a
    /// batch are made from at most this much.
    pub queue_bytes: usize,
    /// Transactions per request (at most; a request also goes after [`BATCH_DELAY`]).
    pub batch: usize,
    /// At the end of the run, how long the exporter may take to send what is queued.
    pub flush_timeout: Duration,
    /// CA and client certificates for `https://` endpoints (`tls.rs`).
    pub tls: TlsPem,
}

/// A batch goes at the latest this long after its first transaction.
pub const BATCH_DELAY: Duration = Duration::from_secs(1);
/// [`OtlpConfig::queue_bytes`] by default: at the 1 % sample and a few failures a second of
/// 10k qps, tens of seconds of a backend's absence.
pub const QUEUE_BYTES: usize = 8 << 20;

impl OtlpConfig {
    /// From `--otlp URL` and the standard `OTEL_EXPORTER_OTLP_*` variables (`env`), the
    /// `TRACES_` form first. `None`: no endpoint anywhere, no export.
    pub fn from_env(
        url: Option<&str>,
        protocol: Option<Protocol>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, OtlpError> {
        let var = |name: &str| {
            env(&format!("OTEL_EXPORTER_OTLP_TRACES_{name}"))
                .or_else(|| env(&format!("OTEL_EXPORTER_OTLP_{name}")))
                .filter(|v| !v.trim().is_empty())
        };
        let protocol = match var("PROTOCOL").as_deref().map(str::trim) {
            _ if protocol.is_some() => protocol.unwrap_or(Protocol::HttpProtobuf),
            None | Some("http/protobuf") => Protocol::HttpProtobuf,
            Some("grpc") => Protocol::Grpc,
            Some(p) => {
                return Err(OtlpError::Setting(
                    "OTEL_EXPORTER_OTLP_PROTOCOL",
                    format!("{p:?}: dnspath sends `http/protobuf` or `grpc`"),
                ))
            }
        };
        // `--otlp` and `…_TRACES_ENDPOINT` are used as given (HTTP: a bare host gets
        // `/v1/traces`); `OTEL_EXPORTER_OTLP_ENDPOINT` is a base URL (HTTP: `/v1/traces`
        // appended), as the specification says.
        let endpoint = match (
            url,
            env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").filter(|v| !v.is_empty()),
            env("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|v| !v.is_empty()),
        ) {
            (Some(u), _, _) => signal_url(u, protocol, false)?,
            (None, Some(u), _) => signal_url(&u, protocol, false)?,
            (None, None, Some(u)) => signal_url(&u, protocol, true)?,
            (None, None, None) => return Ok(None),
        };
        let headers = match var("HEADERS") {
            Some(h) => parse_headers(&h)?,
            None => Vec::new(),
        };
        let timeout = match var("TIMEOUT") {
            Some(t) => Duration::from_millis(t.trim().parse::<u64>().map_err(|e| {
                OtlpError::Setting("OTEL_EXPORTER_OTLP_TIMEOUT", format!("{t:?}: {e}"))
            })?),
            None => Duration::from_secs(10),
        };
        let gzip = match var("COMPRESSION").as_deref().map(str::trim) {
            None | Some("none") => false,
            Some("gzip") => true,
            Some(c) => {
                return Err(OtlpError::Setting(
                    "OTEL_EXPORTER_OTLP_COMPRESSION",
                    format!("{c:?}: `gzip` or `none`"),
                ))
            }
        };
        let tls = TlsPem::from_vars(var)?;
        if !is_tls(&endpoint) && (tls.ca.is_some() || tls.client.is_some()) {
            log::warn!(
                "OTLP endpoint {endpoint} is not https://: the OTEL_EXPORTER_OTLP_*CERTIFICATE/KEY files are not used"
            );
        }
        Ok(Some(Self {
            endpoint,
            protocol,
            headers,
            timeout,
            gzip,
            sample: 1.0,
            slow_ns: 1_000_000_000,
            spans: SpanConfig::default(),
            queue: 8192,
            queue_bytes: QUEUE_BYTES,
            batch: 512,
            flush_timeout: Duration::from_secs(5),
            tls,
        }))
    }
}

/// The URL spans go to: `http://` or `https://` (TLS, `tls.rs`).
fn signal_url(u: &str, protocol: Protocol, base: bool) -> Result<String, OtlpError> {
    let u = u.trim();
    let (scheme, rest) = match (u.strip_prefix("http://"), u.strip_prefix("https://")) {
        (Some(rest), _) => ("http", rest),
        (None, Some(rest)) => ("https", rest),
        (None, None) => {
            return Err(OtlpError::Endpoint(
                u.into(),
                "not an http:// or https:// URL".into(),
            ))
        }
    };
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let host = rest.find('/').map_or(rest, |i| &rest[..i]);
    if host.is_empty() {
        return Err(OtlpError::Endpoint(u.into(), "no host".into()));
    }
    Ok(match protocol {
        Protocol::Grpc => format!("{scheme}://{host}"),
        Protocol::HttpProtobuf if base || path.is_empty() || path == "/" => {
            format!("{scheme}://{host}{}/v1/traces", path.trim_end_matches('/'))
        }
        Protocol::HttpProtobuf => u.to_string(),
    })
}

/// Whether the endpoint is reached over TLS.
pub(super) fn is_tls(endpoint: &str) -> bool {
    endpoint.starts_with("https://")
}

/// `k1=v1,k2=v2`, values percent-decoded (W3C baggage form, as the specification says).
fn parse_headers(s: &str) -> Result<Vec<(String, String)>, OtlpError> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(OtlpError::Setting(
                "OTEL_EXPORTER_OTLP_HEADERS",
                format!("{item:?}: not key=value"),
            ));
        };
        out.push((k.trim().to_ascii_lowercase(), percent_decode(v.trim())));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| char::from(c).to_digit(16);
        match (
            b.get(i),
            b.get(i + 1).and_then(|c| hex(*c)),
            b.get(i + 2).and_then(|c| hex(*c)),
        ) {
            (Some(b'%'), Some(h), Some(l)) => {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
            }
            (Some(c), _, _) => {
                out.push(*c);
                i += 1;
            }
            (None, _, _) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Variables `vars` as the environment.
    pub(in crate::output::otlp) fn env<'a>(
        vars: &'a [(&'a str, &'a str)],
    ) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn settings_from_flag_and_environment() {
        assert!(OtlpConfig::from_env(None, None, env(&[]))
            .unwrap()
            .is_none());
        let c = OtlpConfig::from_env(Some("http://127.0.0.1:6006"), None, env(&[]))
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:6006/v1/traces");
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        let c = OtlpConfig::from_env(
            None,
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/base/"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "x-a=1,Authorization=Bearer%20t",
                ),
                ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://collector:4318/base/v1/traces");
        assert_eq!(
            c.headers,
            [
                ("x-a".to_string(), "1".to_string()),
                ("authorization".to_string(), "Bearer t".to_string())
            ]
        );
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert!(c.gzip);
        let c = OtlpConfig::from_env(
            None,
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:1"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://c:4318/custom");
        let c = OtlpConfig::from_env(
            Some("http://c:4317"),
            None,
            env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.protocol, c.endpoint.as_str()),
            (Protocol::Grpc, "http://c:4317")
        );
        let c = OtlpConfig::from_env(Some("http://c:4317/"), Some(Protocol::Grpc), env(&[]))
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://c:4317");
        let c = OtlpConfig::from_env(Some("https://c:4318"), None, env(&[]))
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "https://c:4318/v1/traces");
        let c = OtlpConfig::from_env(Some("https://c:4317/"), Some(Protocol::Grpc), env(&[]))
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "https://c:4317");
        assert!(OtlpConfig::from_env(Some("ftp://c"), None, env(&[])).is_err());
        assert!(OtlpConfig::from_env(
            Some("http://c"),
            None,
            env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")])
        )
        .is_err());
    }
}
