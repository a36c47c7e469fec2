use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use std::{
    io::{Read, Write},
    net::TcpListener,
};

use super::*;
use crate::{output::otlp::config::tests::env, test_support::fixtures};

fn failing_tx(port: u16) -> TransactionRecord {
    let client = format!("10.244.1.2:{port}");
    fixtures::transaction(
        "www.lab.test.",
        "A",
        &client,
        None,
        vec![fixtures::leg(
            crate::correlate::LegRole::Query,
            &client,
            "10.96.0.10:53",
            "10.244.1.3:53",
            None,
            None,
        )],
    )
}

/// A one-request-per-connection HTTP receiver: each request's decoded body.
fn receiver() -> (
    String,
    std::sync::mpsc::Receiver<(String, ExportTraceServiceRequest)>,
) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let head_end = loop {
                let n = s.read(&mut chunk).unwrap();
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            while buf.len() < head_end + len {
                let n = s.read(&mut chunk).unwrap();
                buf.extend_from_slice(&chunk[..n]);
            }
            let mut body = buf[head_end..head_end + len].to_vec();
            if head.contains("content-encoding: gzip") {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(&body[..])
                    .read_to_end(&mut out)
                    .unwrap();
                body = out;
            }
            let req = ExportTraceServiceRequest::decode(&body[..]).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .unwrap();
            let _ = tx.send((head, req));
        }
    });
    (url, rx)
}

fn config(url: &str) -> OtlpConfig {
    let mut c = OtlpConfig::from_env(Some(url), None, env(&[]))
        .unwrap()
        .unwrap();
    c.flush_timeout = Duration::from_secs(4);
    c
}

#[test]
fn spans_reach_an_http_receiver_gzipped_with_headers() {
    let (url, rx) = receiver();
    let mut c = config(&url);
    c.gzip = true;
    c.headers = vec![("x-project-name".into(), "p".into())];
    let e = Exporter::start(c).unwrap();
    for port in 0..3 {
        e.offer(&failing_tx(40000 + port));
    }
    let stats = e.finish();
    assert_eq!(stats.transactions_exported, 3, "{stats:?}");
    assert_eq!(stats.spans_exported, 6, "a root and a client span each");
    let (head, req) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(head.starts_with("post /v1/traces "), "{head}");
    assert!(head.contains("content-type: application/x-protobuf"));
    assert!(head.contains("x-project-name: p"));
    let spans: usize = req
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum();
    assert_eq!(spans, 6);
}

/// A receiver that is down: offering never waits, every transaction is counted as lost.
#[test]
fn a_receiver_down_loses_spans_counted_never_time() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut c = config(&format!("http://127.0.0.1:{port}"));
    c.queue = 4;
    let e = Exporter::start(c).unwrap();
    let t0 = Instant::now();
    for p in 0..100 {
        e.offer(&failing_tx(40000 + p));
    }
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    let s = e.finish();
    assert_eq!(s.transactions_exported, 0);
    assert_eq!(
        s.dropped_queue_full + s.dropped_export_failed + s.dropped_at_exit,
        100,
        "{s:?}"
    );
    assert!(s.dropped_queue_full > 0);
    assert!(s.request_failures > 0);
}

#[test]
fn sampling_keeps_failures_and_drops_the_rest_by_id() {
    let (url, _rx) = receiver();
    let mut c = config(&url);
    c.sample = 0.0;
    let e = Exporter::start(c).unwrap();
    let crate::output::record::Record::Transaction(ok) =
        fixtures::service_transaction("www.lab.test.", "A", 40005, "NOERROR")
    else {
        unreachable!()
    };
    e.offer(&ok);
    e.offer(&failing_tx(40001));
    let s = e.finish();
    assert_eq!((s.sampled_out, s.transactions_exported), (1, 1), "{s:?}");
}

/// A PEM file of the test's own, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, body: &str) -> Self {
        let p = std::env::temp_dir().join(format!("dnspath-tls-{}-{name}", std::process::id()));
        std::fs::write(&p, body).unwrap();
        Self(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn tls_files_that_cannot_serve_are_errors_at_start() {
    let err = |vars: &[(&str, &str)]| {
        OtlpConfig::from_env(Some("https://c:4318"), None, env(vars))
            .unwrap_err()
            .to_string()
    };
    // A missing file names the variable and the path.
    let e = err(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")]);
    assert!(
        e.contains("OTEL_EXPORTER_OTLP_CERTIFICATE") && e.contains("/nonexistent/ca.pem"),
        "{e}"
    );
    // A file with no certificate in it.
    let junk = TempFile::new("junk.pem", "not a certificate\n");
    let e = err(&[("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", junk.path())]);
    assert!(e.contains("no certificate"), "{e}");
    // A client certificate without its key, and a key file with no key.
    let e = err(&[("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", junk.path())]);
    assert!(e.contains("needs its key"), "{e}");
    let cert = TempFile::new("cert.pem", CERT);
    let e = err(&[
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert.path()),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", junk.path()),
    ]);
    assert!(e.contains("no private key"), "{e}");
    // A real certificate is taken, for the server's CA and as a client's.
    let key = TempFile::new("key.pem", KEY);
    let c = OtlpConfig::from_env(
        Some("https://c:4318"),
        None,
        env(&[
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", cert.path()),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert.path()),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", key.path()),
        ]),
    )
    .unwrap()
    .unwrap();
    assert!(c.tls.ca.is_some() && c.tls.client.is_some());
    assert!(c.tls.http_config().is_ok());
    // The key is never printed.
    assert!(!format!("{c:?}").contains("PRIVATE"), "{c:?}");
}

#[test]
fn an_https_endpoint_whose_certificate_is_not_trusted_is_a_counted_failure() {
    // A plain-HTTP server behind an https:// URL: the handshake fails, nothing is sent, the
    // spans are counted as dropped and the exporter ends within its bound.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut c in listener.incoming().flatten() {
            let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
    });
    let cert = TempFile::new("ca-untrusted.pem", CERT);
    let mut c = OtlpConfig::from_env(
        Some(&url),
        None,
        env(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", cert.path())]),
    )
    .unwrap()
    .unwrap();
    c.flush_timeout = Duration::from_secs(4);
    let e = Exporter::start(c).unwrap();
    e.offer(&failing_tx(40100));
    let t0 = std::time::Instant::now();
    let stats = e.finish();
    assert!(t0.elapsed() < Duration::from_secs(8));
    assert_eq!(stats.transactions_exported, 0, "{stats:?}");
    assert!(stats.request_failures >= 1, "{stats:?}");
    assert_eq!(stats.dropped_export_failed, 1, "{stats:?}");
}

/// A self-signed certificate and its key (EC P-256, CN=dnspath-test; made with openssl for
/// these tests, never trusted anywhere).
const CERT: &str = include_str!("testdata/cert.pem");
const KEY: &str = include_str!("testdata/key.pem");
/// A loop's transaction: 64 legs of 64 hops each, answered with a few records.
fn loop_tx(port: u16) -> TransactionRecord {
    let client = format!("10.244.1.2:{port}");
    let mut leg = fixtures::leg(
        crate::correlate::LegRole::Forward,
        &client,
        "10.96.0.10:53",
        "10.244.1.3:53",
        Some("NOERROR"),
        Some(1000),
    );
    leg.answers = (0..4).map(|i| format!("A 10.250.0.{i}")).collect();
    let hop = crate::output::record::HopRecord {
        ts_ns: 1,
        netns: "node".into(),
        ifname: "veth0".into(),
        pod: Default::default(),
        dir: crate::event::Direction::Egress,
        src: fixtures::addr(&client),
        dst: fixtures::addr("10.96.0.10:53"),
        dns_id: 7,
        qr: false,
        latency_ns: None,
        tunnel: None,
    };
    leg.hops = vec![hop; 64];
    fixtures::transaction(
        "www.lab.test.",
        "A",
        &client,
        Some("NOERROR"),
        vec![leg; 64],
    )
}

/// [`record_bytes`] covers what a queued copy of a record takes from the allocator (the
/// queue's byte bound is a bound on memory), for small and loop-sized transactions.
#[test]
fn record_bytes_cover_a_queued_copy() {
    for (what, tx) in [("one leg", failing_tx(40000)), ("a loop's", loop_tx(40001))] {
        let (copies, taken) = crate::memory::heap_bytes_of(|| {
            (0..64)
                .map(|_| Box::new(tx.clone()))
                .collect::<Vec<Box<TransactionRecord>>>()
        });
        let Some(taken) = taken else {
            eprintln!("system allocator: no heap figure");
            return;
        };
        let taken = taken / copies.len();
        let counted = record_bytes(&tx);
        eprintln!("{what} transaction: {taken} bytes taken, {counted} counted");
        assert!(counted >= taken, "{what}: {counted} counted, {taken} taken");
        assert!(
            counted <= 2 * taken + 1024,
            "{what}: {counted} counted, {taken} taken"
        );
    }
}

/// A receiver that is down and transactions of a loop's size: the queue holds at most its
/// byte budget, the rest is dropped and counted as a full queue, and nothing is lost
/// uncounted.
#[test]
fn the_queue_is_bounded_in_bytes() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut c = config(&format!("http://127.0.0.1:{port}"));
    let big = loop_tx(40000);
    let each = record_bytes(&big);
    c.queue_bytes = 10 * each;
    c.flush_timeout = Duration::from_millis(200);
    let e = Exporter::start(c).unwrap();
    for _ in 0..100 {
        e.offer(&big);
        assert!(e.counters.queued_bytes.load(Ordering::Relaxed) <= 10 * each as u64);
    }
    let s = e.finish();
    assert!(s.dropped_queue_full >= 90, "{s:?}");
    assert_eq!(
        s.transactions_exported
            + s.dropped_queue_full
            + s.dropped_export_failed
            + s.dropped_at_exit,
        100,
        "{s:?}"
    );
}

/// hyper's `client error (SendRequest)` says nothing by itself: the failure names the
/// protocol tried and its causes, and at OTLP's gRPC port hints `--otlp-protocol grpc`.
#[test]
fn a_failed_request_says_its_protocol_causes_and_the_grpc_hint() {
    #[derive(Debug)]
    struct Cause;
    impl std::fmt::Display for Cause {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("connection closed before message completed")
        }
    }
    impl std::error::Error for Cause {}
    #[derive(Debug)]
    struct Outer(Cause);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("client error (SendRequest)")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    let grpc = super::http_failure(&Outer(Cause), "http://collector:4317/v1/traces");
    assert_eq!(
        grpc,
        "http/protobuf: client error (SendRequest): connection closed before message \
         completed (4317 is OTLP's gRPC port: --otlp-protocol grpc?)"
    );
    let http = super::http_failure(&Outer(Cause), "http://collector:4318/v1/traces");
    assert!(http.ends_with("completed"), "{http}");
    assert!(!http.contains("grpc"), "{http}");
}
