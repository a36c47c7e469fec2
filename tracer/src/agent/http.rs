//! The agent's HTTP endpoints (axum; in the agent on a thread and runtime of their own,
//! [`spawn_server`], so a reader busy with a storm never keeps a probe or a scrape waiting):
//! - `/metrics`: [`Metrics`] as OpenMetrics text when the scrape asks for it (Prometheus
//!   does), else the classic Prometheus text format;
//! - `/healthz`: 200 while programs are attached and the ring buffer was read recently (a
//!   liveness probe: a reader stuck for [`Health::stale_after`] restarts the pod);
//! - `/readyz`: 200 once programs are attached and the ring buffer was read at least once.
use std::{
    future::Future,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use axum::{
    extract::State,
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use tokio::net::TcpListener;

use super::metrics::{Exposition, Metrics};

/// Where the agent listens unless told otherwise: loopback only (a node's metrics are not
/// for everyone on the network); 9253 is next to CoreDNS's 9153.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9253));

/// How long the ring buffer may go unread before `/healthz` fails, by default.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server on {addr}: its thread panicked")]
    Panicked { addr: SocketAddr },
}

const NEVER: u64 = u64::MAX;

/// What `/healthz` and `/readyz` report: set by the agent's reader, read by the server.
#[derive(Debug)]
pub struct Health {
    start: Instant,
    attached: AtomicBool,
    /// Nanoseconds since `start` of the latest ring-buffer read, or [`NEVER`].
    last_read_ns: AtomicU64,
    stale_after: Duration,
}

impl Default for Health {
    fn default() -> Self {
        Self::new(DEFAULT_STALE_AFTER)
    }
}

impl Health {
    pub fn new(stale_after: Duration) -> Self {
        Self {
            start: Instant::now(),
            attached: AtomicBool::new(false),
            last_read_ns: AtomicU64::new(NEVER),
            stale_after,
        }
    }

    /// Programs are attached (true after the first successful attach; false if the agent
    /// detaches, e.g. while shutting down).
    pub fn set_attached(&self, attached: bool) {
        self.attached.store(attached, Ordering::Relaxed);
    }

    /// The reader polled the ring buffer. Call it on every wake-up of the read loop and on
    /// its periodic tick, not only when records arrive: an idle node is healthy.
    pub fn mark_read(&self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(NEVER - 1);
        self.last_read_ns
            .store(ns.min(NEVER - 1), Ordering::Relaxed);
    }

    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    fn since_read(&self) -> Option<Duration> {
        match self.last_read_ns.load(Ordering::Relaxed) {
            NEVER => None,
            ns => Some(
                self.start
                    .elapsed()
                    .saturating_sub(Duration::from_nanos(ns)),
            ),
        }
    }

    /// `Ok` when live, else why not.
    pub fn check_live(&self) -> Result<(), String> {
        if !self.attached.load(Ordering::Relaxed) {
            return Err("eBPF programs are not attached".to_string());
        }
        match self.since_read() {
            None => Err("the ring buffer has not been read yet".to_string()),
            Some(d) if d > self.stale_after => Err(format!(
                "the ring buffer was last read {:.1} s ago (limit {:.1} s)",
                d.as_secs_f64(),
                self.stale_after.as_secs_f64()
            )),
            Some(_) => Ok(()),
        }
    }

    /// `Ok` once attached and read at least once, else why not.
    pub fn check_ready(&self) -> Result<(), String> {
        if !self.attached.load(Ordering::Relaxed) {
            return Err("eBPF programs are not attached yet".to_string());
        }
        if self.since_read().is_none() {
            return Err("the ring buffer has not been read yet".to_string());
        }
        Ok(())
    }
}

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct AgentState {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

async fn metrics(State(s): State<AgentState>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Exposition::negotiate(accept);
    let body = s.metrics.encode_as(format);
    ([(header::CONTENT_TYPE, format.content_type())], body).into_response()
}

fn probe(result: Result<(), String>, ok: &'static str) -> Response {
    let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    match result {
        Ok(()) => (StatusCode::OK, text, format!("{ok}\n")).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, text, format!("{why}\n")).into_response(),
    }
}

async fn healthz(State(s): State<AgentState>) -> Response {
    probe(s.health.check_live(), "ok")
}

async fn readyz(State(s): State<AgentState>) -> Response {
    probe(s.health.check_ready(), "ready")
}

/// The routes, for a caller that serves them itself.
pub fn router(state: AgentState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Binds `listen` (port 0 picks one: see the listener's `local_addr`).
pub async fn bind(listen: SocketAddr) -> Result<TcpListener, HttpError> {
    TcpListener::bind(listen)
        .await
        .map_err(|source| HttpError::Bind {
            addr: listen,
            source,
        })
}

/// Serves the endpoints on `listener` until `shutdown` completes (then finishes the requests
/// under way and returns).
pub async fn serve_on(
    listener: TcpListener,
    state: AgentState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HttpError> {
    let addr = listener
        .local_addr()
        .unwrap_or(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)));
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| HttpError::Serve { addr, source })
}

/// The endpoints served on a thread of their own, with a runtime of their own: the agent's
/// runtime has one thread, which a forwarding loop's storm keeps reading the ring buffer;
/// on it, `/healthz` went unanswered for over a minute of the soak — long enough for a
/// liveness probe to restart a healthy agent in the middle of the storm it should report.
pub struct ServerThread {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), HttpError>>>,
}

/// Serves `listener` (bound on any runtime) on a new thread until [`ServerThread::stop`].
pub fn spawn_server(listener: TcpListener, state: AgentState) -> Result<ServerThread, HttpError> {
    let addr = listener
        .local_addr()
        .unwrap_or(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)));
    let serve_err = move |source| HttpError::Serve { addr, source };
    let listener = listener.into_std().map_err(serve_err)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("dnspath-http".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(serve_err)?;
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).map_err(serve_err)?;
                serve_on(listener, state, async move {
                    let _ = stopped.await;
                })
                .await
            })
        })
        .map_err(serve_err)?;
    Ok(ServerThread {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    })
}

impl ServerThread {
    /// Stops the server (it finishes the requests it has) and waits for its thread, off the
    /// caller's runtime thread.
    pub async fn stop(mut self) -> Result<(), HttpError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let addr = self.addr;
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(r)) => r,
            _ => Err(HttpError::Panicked { addr }),
        }
    }
}

impl Drop for ServerThread {
    /// Left without [`ServerThread::stop`] (an error on the way): told to stop, not waited for.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Binds `listen` and serves the endpoints until `shutdown` completes.
pub async fn serve(
    listen: SocketAddr,
    state: AgentState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HttpError> {
    serve_on(bind(listen).await?, state, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::fixtures::service_transaction;

    struct Reply {
        status: u16,
        content_type: String,
        body: String,
    }

    /// A plain HTTP/1.1 GET over a std TCP stream (off the runtime's thread).
    async fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> Reply {
        let accept = accept
            .map(|a| format!("Accept: {a}\r\n"))
            .unwrap_or_default();
        let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{accept}Connection: close\r\n\r\n");
        let raw = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).unwrap();
            raw
        })
        .await
        .unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let content_type = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-type")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default();
        Reply {
            status,
            content_type,
            body: body.to_string(),
        }
    }

    /// The agent's runtime thread blocked, as a reader in a storm keeps it: the server on its
    /// own thread still answers (on the runtime's thread it would not, until the read timed
    /// out), and stops when told.
    #[tokio::test]
    async fn the_server_answers_while_the_agents_runtime_thread_is_busy() {
        let health = Arc::new(Health::new(Duration::from_secs(60)));
        health.set_attached(true);
        health.mark_read();
        let state = AgentState {
            metrics: Arc::new(Metrics::new()),
            health,
        };
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = spawn_server(listener, state).unwrap();
        // Blocks this runtime's only thread until the GET is done.
        let raw = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).map(|_| raw)
        })
        .join()
        .unwrap()
        .expect("answered while the runtime's thread was blocked");
        let raw = String::from_utf8(raw).unwrap();
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
        assert!(raw.ends_with("ok\n"), "{raw}");
        server.stop().await.unwrap();
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "stopped: nothing listens"
        );
    }

    #[tokio::test]
    async fn endpoints_answer_with_status_and_body() {
        let metrics = Arc::new(Metrics::new());
        metrics.observe(&service_transaction("www.lab.test.", "A", 40005, "NOERROR"));
        let health = Arc::new(Health::new(Duration::from_millis(200)));
        let state = AgentState {
            metrics: metrics.clone(),
            health: health.clone(),
        };
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_on(listener, state, async move {
            let _ = stopped.await;
        }));

        // Before the first attach and read: neither live nor ready.
        let r = get(addr, "/healthz", None).await;
        assert_eq!(r.status, 503);
        assert!(r.body.contains("not attached"), "{}", r.body);
        let r = get(addr, "/readyz", None).await;
        assert_eq!(r.status, 503);
        health.set_attached(true);
        let r = get(addr, "/readyz", None).await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (503, "the ring buffer has not been read yet\n")
        );

        health.mark_read();
        let r = get(addr, "/healthz", None).await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
        let r = get(addr, "/readyz", None).await;
        assert_eq!((r.status, r.body.as_str()), (200, "ready\n"));

        // What Prometheus sends: OpenMetrics first.
        let r = get(
            addr,
            "/metrics",
            Some("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.content_type,
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert!(
            r.body
                .contains(r#"dnspath_dns_queries_total{leg="service",proto="udp",qtype="A"} 1"#),
            "{}",
            r.body
        );
        assert!(r.body.ends_with("# EOF\n"));
        // curl, or an older scraper: the classic text format.
        let r = get(addr, "/metrics", None).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
        assert!(
            r.body.contains("# TYPE dnspath_dns_queries_total counter"),
            "{}",
            r.body
        );

        assert_eq!(get(addr, "/nothing", None).await.status, 404);

        // A reader that stopped reading is not live any more (still ready: it was once).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = get(addr, "/healthz", None).await;
        assert_eq!(r.status, 503);
        assert!(r.body.contains("last read"), "{}", r.body);
        assert_eq!(get(addr, "/readyz", None).await.status, 200);

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn a_busy_port_is_a_bind_error() {
        let taken = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = bind(addr).await.unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("cannot listen on {addr}")),
            "{err}"
        );
    }
}
