//! The exporter: a thread of its own with a bounded queue of decided transactions, which it
//! turns into spans, batches and sends over OTLP/HTTP (protobuf) or OTLP/gRPC, retrying with
//! backoff. The tracing side only offers: a full queue or a backend that is down loses spans,
//! counted, never time (docs/otlp.md, "Exporter").
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use std::borrow::Borrow;

use bytes::{Buf, BufMut, Bytes};

use super::{
    config::{is_tls, OtlpConfig, Protocol, BATCH_DELAY},
    error::OtlpError,
    ids,
    spans::{self, SpanConfig},
    wire,
};
use crate::output::record::{OtlpStats, TransactionRecord};

/// Attempts per request (the first and the retries).
const ATTEMPTS: u32 = 4;
const BACKOFF_START: Duration = Duration::from_millis(250);

#[derive(Default)]
struct Counters {
    queued: AtomicU64,
    /// [`record_bytes`] of what is queued or being sent.
    queued_bytes: AtomicU64,
    transactions_exported: AtomicU64,
    spans_exported: AtomicU64,
    sampled_out: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_export_failed: AtomicU64,
    requests: AtomicU64,
    request_failures: AtomicU64,
}

impl Counters {
    fn stats(&self, at_exit: bool) -> OtlpStats {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let done = r(&self.transactions_exported) + r(&self.dropped_export_failed);
        OtlpStats {
            transactions_exported: r(&self.transactions_exported),
            spans_exported: r(&self.spans_exported),
            sampled_out: r(&self.sampled_out),
            dropped_queue_full: r(&self.dropped_queue_full),
            dropped_export_failed: r(&self.dropped_export_failed),
            dropped_at_exit: if at_exit {
                r(&self.queued).saturating_sub(done)
            } else {
                0
            },
            requests: r(&self.requests),
            request_failures: r(&self.request_failures),
        }
    }
}

/// The tracing side's handle: [`Exporter::offer`] never blocks.
/// A queued transaction and its [`record_bytes`].
type Queued = (Box<TransactionRecord>, u64);

pub struct Exporter {
    queue: Option<tokio::sync::mpsc::Sender<Queued>>,
    queue_bytes: u64,
    counters: Arc<Counters>,
    done: std::sync::mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
    sample: f64,
    slow_ns: u64,
    key: ids::IdKey,
    flush_timeout: Duration,
}

impl Exporter {
    /// Starts the exporter's thread (its own single-threaded runtime).
    pub fn start(cfg: OtlpConfig) -> Result<Self, OtlpError> {
        let (tx, rx) = tokio::sync::mpsc::channel(cfg.queue.max(1));
        let counters = Arc::new(Counters::default());
        let (done_tx, done) = std::sync::mpsc::channel();
        let c = Arc::clone(&counters);
        let sample = cfg.sample;
        let slow_ns = cfg.slow_ns;
        let key = cfg.spans.key.clone();
        let flush_timeout = cfg.flush_timeout;
        let queue_bytes = cfg.queue_bytes as u64;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                // Export is best effort: under contention the pipeline gets the CPU first.
                crate::output::queue::yield_to_pipeline();
                rt.block_on(drain(cfg, rx, &c));
                let _ = done_tx.send(());
            })?;
        Ok(Self {
            queue: Some(tx),
            queue_bytes,
            counters,
            done,
            thread: Some(thread),
            sample,
            slow_ns,
            key,
            flush_timeout,
        })
    }

    /// Queues a decided transaction if it is sampled (its trace id against the ratio) or
    /// failing or slow; a full queue (in transactions or bytes) drops it, counted. O(1) but
    /// for the record's copy, made only once the queue has a place for it.
    pub fn offer(&self, tx: &TransactionRecord) {
        let Some(q) = &self.queue else { return };
        // Every transaction kept (`--otlp-sample 1`): no trace id needed to decide.
        let keep = self.sample >= 1.0
            || tx.troubled()
            || tx.latency_ns.is_some_and(|l| l >= self.slow_ns)
            || ids::sampled(&spans::trace_ids(&self.key, tx).trace, self.sample);
        if !keep {
            self.counters.sampled_out.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // A place first: a full queue (a slow backend) costs no copy. Only this thread
        // sends, so neither the place nor the byte budget can be taken in between.
        let Ok(place) = q.try_reserve() else {
            self.counters
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        let bytes = record_bytes(tx) as u64;
        let held = &self.counters.queued_bytes;
        if held.load(Ordering::Relaxed) + bytes > self.queue_bytes {
            drop(place);
            self.counters
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        held.fetch_add(bytes, Ordering::Relaxed);
        place.send((Box::new(tx.clone()), bytes));
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn stats(&self) -> OtlpStats {
        self.counters.stats(false)
    }

    /// Closes the queue and gives the exporter up to the flush time to send what it holds;
    /// what is left then is counted as dropped at exit (the thread is left to the process's
    /// end).
    pub fn finish(mut self) -> OtlpStats {
        self.queue = None;
        if self.done.recv_timeout(self.flush_timeout).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
        self.counters.stats(true)
    }
}

/// The exporter thread: batches of transactions into requests until the queue is closed
/// and empty.
async fn drain(cfg: OtlpConfig, mut rx: tokio::sync::mpsc::Receiver<Queued>, counters: &Counters) {
    let mut client = match Client::new(&cfg) {
        Ok(c) => c,
        Err(e) => {
            log::warn!("{e}; no spans will be exported");
            while let Some((_t, bytes)) = rx.recv().await {
                counters.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
                counters
                    .dropped_export_failed
                    .fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
    };
    let batch = cfg.batch.max(1);
    // A request goes once its transactions reach a quarter of the byte budget.
    let batch_bytes = (cfg.queue_bytes as u64 / 4).max(1);
    let mut buf: Vec<Queued> = Vec::with_capacity(batch);
    let mut requests = Requests::default();
    let mut first: Option<Instant> = None;
    loop {
        let wait = first.map_or(BATCH_DELAY, |f| BATCH_DELAY.saturating_sub(f.elapsed()));
        let closed = match tokio::time::timeout(wait, rx.recv_many(&mut buf, batch)).await {
            Ok(0) => true,
            Ok(_) => {
                first.get_or_insert_with(Instant::now);
                false
            }
            Err(_) => false,
        };
        let due = first.is_some_and(|f| f.elapsed() >= BATCH_DELAY);
        let bytes: u64 = buf.iter().map(|(_, b)| b).sum();
        if !buf.is_empty() && (closed || due || buf.len() >= batch || bytes >= batch_bytes) {
            let n = buf.len() as u64;
            let (request, spans) = requests.request(&cfg.spans, buf.drain(..).map(|(t, _)| t));
            first = None;
            let sent = client.send(request, counters).await;
            // Until now the batch, its spans and its encoded request were held.
            counters.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            if sent {
                counters
                    .transactions_exported
                    .fetch_add(n, Ordering::Relaxed);
                counters.spans_exported.fetch_add(spans, Ordering::Relaxed);
            } else {
                counters
                    .dropped_export_failed
                    .fetch_add(n, Ordering::Relaxed);
            }
        }
        if closed {
            return;
        }
    }
}

/// What a queued transaction takes from the allocator, about (its record's own blocks; the
/// question and names it shares with the tracing side are not counted): what
/// [`OtlpConfig::queue_bytes`] bounds.
pub fn record_bytes(tx: &TransactionRecord) -> usize {
    use crate::output::record::{HopRecord, LegRecord};
    use std::mem::size_of;
    /// Allocator rounding and the headers of the small blocks.
    const BLOCK: usize = 16;
    let string = |s: &String| {
        if s.capacity() == 0 {
            0
        } else {
            s.capacity() + BLOCK
        }
    };
    let opt = |s: &Option<String>| s.as_ref().map_or(0, string);
    // Counted as the string it was (a registry name is borrowed now: an overcount).
    let rcode = |r: &Option<crate::decode::dns::Rcode>| r.as_ref().map_or(0, |r| r.len() + BLOCK);
    let strings = |v: &Vec<String>| {
        v.capacity() * size_of::<String>() + v.iter().map(string).sum::<usize>() + BLOCK
    };
    let pod = |p: &crate::output::record::PodRef| opt(&p.pod) + opt(&p.pod_uid) + opt(&p.container);
    let legs = tx.legs.iter().map(|l: &LegRecord| {
        // The allocator's size classes round a vector up to an eighth.
        l.hops.capacity() * size_of::<HopRecord>() * 9 / 8
            + strings(&l.answers)
            + rcode(&l.rcode)
            + l.drop.as_ref().map_or(0, |d| {
                string(&d.reason)
                    + string(&d.location)
                    + d.fragments.as_ref().map_or(0, part_bytes)
                    + d.fragment_drops_ns.capacity() * size_of::<u64>()
            })
            + l.closes_loop.as_ref().map_or(0, |lp| {
                size_of::<crate::correlate::record::LegLoop>()
                    + lp.cycle.capacity() * size_of::<usize>()
                    + 2 * BLOCK
            })
            + 2 * BLOCK
    });
    size_of::<TransactionRecord>()
        + BLOCK
        + tx.legs.capacity() * size_of::<LegRecord>() * 9 / 8
        + legs.sum::<usize>()
        + strings(&tx.answers)
        + rcode(&tx.rcode)
        + opt(&tx.evidence)
        + tx.nodes.capacity() * size_of::<std::sync::Arc<str>>()
        + pod(&tx.pod)
        + summary_bytes(&tx.summary)
}

/// The blocks of a dropped answer's part: its fragment numbers and byte ranges.
fn part_bytes(p: &crate::decode::record::DroppedPart) -> usize {
    p.numbers.capacity() * std::mem::size_of::<usize>()
        + p.bytes.capacity() * std::mem::size_of::<crate::decode::record::MissingRange>()
        + 32
}

fn summary_bytes(s: &crate::correlate::record::Summary) -> usize {
    use crate::correlate::record::Summary;
    match s {
        Summary::AnswerLost {
            location,
            netns,
            ifname,
            part,
            ..
        } => {
            location.capacity()
                + netns.capacity()
                + ifname.capacity()
                + 48
                + part.as_ref().map_or(0, part_bytes)
        }
        Summary::Dropped {
            reason,
            location,
            part,
            ..
        } => reason.capacity() + location.capacity() + 32 + part.as_ref().map_or(0, part_bytes),
        Summary::Late {
            reason, location, ..
        } => reason.capacity() + location.capacity() + 32,
        Summary::Answered(_) | Summary::Pending | Summary::Unanswered { .. } => 0,
    }
}

/// Transactions into OTLP requests; its buffers are kept from one request to the next.
pub struct Requests {
    buf: wire::RequestBuf,
    scratch: spans::Scratch,
    /// The `InstrumentationScope` of every request: dnspath and its version.
    scope: Vec<u8>,
}

impl Default for Requests {
    fn default() -> Self {
        Self {
            buf: wire::RequestBuf::default(),
            scratch: spans::Scratch::default(),
            scope: wire::scope("dnspath", env!("CARGO_PKG_VERSION")),
        }
    }
}

impl Requests {
    /// The spans of `txs` as one `ExportTraceServiceRequest`'s protobuf, grouped by
    /// resource; and how many spans.
    pub fn request<T: Borrow<TransactionRecord>>(
        &mut self,
        cfg: &SpanConfig,
        txs: impl Iterator<Item = T>,
    ) -> (Vec<u8>, u64) {
        for tx in txs {
            spans::write(cfg, tx.borrow(), &mut self.buf, &mut self.scratch);
        }
        let count = self.buf.len() as u64;
        (self.buf.encode(&self.scope), count)
    }
}

/// [`Requests::request`] with buffers of its own.
pub fn request<T: Borrow<TransactionRecord>>(
    cfg: &SpanConfig,
    txs: impl Iterator<Item = T>,
) -> (Vec<u8>, u64) {
    Requests::default().request(cfg, txs)
}

type Body = http_body_util::Full<Bytes>;
type Plain = hyper_util::client::legacy::connect::HttpConnector;

/// An HTTP/1.1 client, plain or over TLS.
enum HttpClient {
    Plain(hyper_util::client::legacy::Client<Plain, Body>),
    Tls(hyper_util::client::legacy::Client<hyper_rustls::HttpsConnector<Plain>, Body>),
}

impl HttpClient {
    fn new(cfg: &OtlpConfig) -> Result<Self, OtlpError> {
        let builder =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
        if !is_tls(&cfg.endpoint) {
            return Ok(Self::Plain(builder.build_http()));
        }
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(cfg.tls.http_config()?)
            .https_only()
            .enable_http1()
            .build();
        Ok(Self::Tls(builder.build(https)))
    }

    fn request(&self, req: hyper::Request<Body>) -> hyper_util::client::legacy::ResponseFuture {
        match self {
            Self::Plain(c) => c.request(req),
            Self::Tls(c) => c.request(req),
        }
    }
}

enum Transport {
    Http(HttpClient),
    Grpc(tonic::client::Grpc<tonic::transport::Channel>),
}

struct Client {
    transport: Transport,
    cfg: OtlpConfig,
}

/// Whether a failed attempt may succeed if repeated.
enum Attempt {
    Ok,
    Retry(String),
    Fail(String),
}

impl Client {
    fn new(cfg: &OtlpConfig) -> Result<Self, OtlpError> {
        let transport = match cfg.protocol {
            Protocol::HttpProtobuf => Transport::Http(HttpClient::new(cfg)?),
            Protocol::Grpc => {
                let mut ep = tonic::transport::Endpoint::from_shared(cfg.endpoint.clone())
                    .map_err(|e| OtlpError::Endpoint(cfg.endpoint.clone(), e.to_string()))?
                    .timeout(cfg.timeout)
                    .connect_timeout(cfg.timeout);
                if is_tls(&cfg.endpoint) {
                    ep = ep
                        .tls_config(cfg.tls.grpc_config())
                        .map_err(|e| OtlpError::Endpoint(cfg.endpoint.clone(), e.to_string()))?;
                }
                let mut c = tonic::client::Grpc::new(ep.connect_lazy());
                if cfg.gzip {
                    c = c.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                Transport::Grpc(c)
            }
        };
        Ok(Self {
            transport,
            cfg: cfg.clone(),
        })
    }

    /// Sends a request's protobuf with retries and backoff; whether the backend took it.
    async fn send(&mut self, request: Vec<u8>, counters: &Counters) -> bool {
        let body = match self.transport {
            Transport::Http(_) => http_body(request, self.cfg.gzip),
            Transport::Grpc(_) => Bytes::from(request),
        };
        let mut backoff = BACKOFF_START;
        for attempt in 1..=ATTEMPTS {
            counters.requests.fetch_add(1, Ordering::Relaxed);
            let r = match &mut self.transport {
                Transport::Http(c) => http_attempt(c, &self.cfg, body.clone()).await,
                Transport::Grpc(c) => grpc_attempt(c, &self.cfg, body.clone()).await,
            };
            match r {
                Attempt::Ok => return true,
                Attempt::Fail(e) => {
                    counters.request_failures.fetch_add(1, Ordering::Relaxed);
                    log::warn!("OTLP export to {}: {e}; spans dropped", self.cfg.endpoint);
                    return false;
                }
                Attempt::Retry(e) => {
                    counters.request_failures.fetch_add(1, Ordering::Relaxed);
                    if attempt == ATTEMPTS {
                        log::warn!(
                            "OTLP export to {}: {e} ({ATTEMPTS} attempts); spans dropped",
                            self.cfg.endpoint
                        );
                        return false;
                    }
                    log::debug!("OTLP export to {}: {e}; retrying", self.cfg.endpoint);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(4));
                }
            }
        }
        false
    }
}

/// The body of an OTLP/HTTP request: the request's protobuf (`wire.rs`), gzipped (fast) if
/// asked.
pub fn http_body(raw: Vec<u8>, gzip: bool) -> Bytes {
    if !gzip {
        return Bytes::from(raw);
    }
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(raw.len() / 4),
        flate2::Compression::fast(),
    );
    match gz.write_all(&raw).and_then(|()| gz.finish()) {
        Ok(z) => Bytes::from(z),
        Err(_) => Bytes::from(raw),
    }
}

async fn http_attempt(c: &HttpClient, cfg: &OtlpConfig, body: Bytes) -> Attempt {
    let zipped = cfg.gzip && body.starts_with(&[0x1f, 0x8b]);
    let mut req = hyper::Request::post(cfg.endpoint.as_str())
        .header("content-type", "application/x-protobuf")
        .header("user-agent", concat!("dnspath/", env!("CARGO_PKG_VERSION")));
    if zipped {
        req = req.header("content-encoding", "gzip");
    }
    for (k, v) in &cfg.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = match req.body(http_body_util::Full::new(body)) {
        Ok(r) => r,
        Err(e) => return Attempt::Fail(format!("request: {e}")),
    };
    let resp = match tokio::time::timeout(cfg.timeout, c.request(req)).await {
        Err(_) => return Attempt::Retry(format!("no response in {:?}", cfg.timeout)),
        Ok(Err(e)) => return Attempt::Retry(http_failure(&e, cfg.endpoint.as_str())),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    // Read the body, so that the connection can be kept.
    let _ = tokio::time::timeout(
        cfg.timeout,
        http_body_util::BodyExt::collect(resp.into_body()),
    )
    .await;
    if status.is_success() {
        Attempt::Ok
    } else if matches!(status.as_u16(), 429 | 502 | 503 | 504) {
        Attempt::Retry(format!("HTTP {status}"))
    } else {
        Attempt::Fail(format!("HTTP {status}"))
    }
}

/// Why a request got no response, with the causes hyper nests (`client error
/// (SendRequest)` alone says nothing) and, at OTLP's gRPC port, the likely mistake.
fn http_failure(e: &(dyn std::error::Error + 'static), endpoint: &str) -> String {
    let mut text = format!("http/protobuf: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    let grpc_port = endpoint
        .parse::<hyper::Uri>()
        .ok()
        .and_then(|u| u.port_u16())
        == Some(4317);
    if grpc_port {
        text.push_str(" (4317 is OTLP's gRPC port: --otlp-protocol grpc?)");
    }
    text
}

/// The gRPC method spans are exported with.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The gRPC codec of a request already encoded (`wire.rs`): its bytes as they are; the
/// response (an `ExportTraceServiceResponse`, whose partial success is not read) consumed.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ();
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), Self::Error> {
        dst.put(item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = ();
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<()>, Self::Error> {
        src.advance(src.remaining());
        Ok(Some(()))
    }
}

async fn grpc_attempt(
    c: &mut tonic::client::Grpc<tonic::transport::Channel>,
    cfg: &OtlpConfig,
    body: Bytes,
) -> Attempt {
    let mut req = tonic::Request::new(body);
    for (k, v) in &cfg.headers {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(k.as_bytes()),
            tonic::metadata::MetadataValue::try_from(v.as_str()),
        ) {
            req.metadata_mut().insert(k, v);
        }
    }
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(GRPC_EXPORT);
    let call = async {
        c.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("not ready: {e}")))?;
        c.unary::<_, (), _>(req, path, RawCodec).await
    };
    match tokio::time::timeout(cfg.timeout, call).await {
        Err(_) => Attempt::Retry(format!("no response in {:?}", cfg.timeout)),
        Ok(Ok(_)) => Attempt::Ok,
        Ok(Err(s)) => match s.code() {
            tonic::Code::Unavailable
            | tonic::Code::ResourceExhausted
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Aborted
            | tonic::Code::Cancelled => Attempt::Retry(format!("gRPC {s}")),
            _ => Attempt::Fail(format!("gRPC {s}")),
        },
    }
}

#[cfg(test)]
#[path = "export_tests.rs"]
mod tests;
