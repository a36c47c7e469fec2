//! `dnspath agent`: the live pipeline on every namespace of the node, with no per-packet
//! output — Prometheus metrics and health over HTTP, and an NDJSON stream (stdout, the
//! container log) of the events people act on. Runs until SIGTERM (or SIGINT/SIGHUP), then
//! detaches like `trace`; a SIGKILLed agent's leftovers are removed by the next start.
use std::{
    io::Write,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use super::{
    events::{EventSink, EventsConfig, EventsError},
    http::{self, AgentState, Health, HttpError, DEFAULT_STALE_AFTER},
    metrics::{Metrics, MetricsConfig},
};
use crate::{
    event::KernelSetup,
    output::{
        queue::{self, QueuedLines},
        record::{Record, StatsRecord},
    },
    time::Clock,
    trace::{self, LiveSink, TraceError, TraceOptions, TraceSummary},
};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("event stream: {0}")]
    Events(#[from] EventsError),
}

pub struct AgentOptions {
    /// What to capture; the agent forces `--all-netns`, the transaction view (the metrics
    /// come from transactions) and no count/until.
    pub trace: TraceOptions,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub listen: SocketAddr,
    pub metrics: MetricsConfig,
    /// `--otlp`: transactions also exported as spans (docs/otlp.md).
    pub otlp: Option<crate::output::otlp::OtlpConfig>,
}

/// Event lines the stream's queue holds while stdout's reader is slow.
const EVENT_LINES: usize = 4_096;

/// The agent's sink: every record counted in the metrics and offered to the event stream,
/// whose lines a thread writes behind a bounded queue (a slow log reader costs lines,
/// counted in `dnspath_sink_dropped_total{sink="events"}`, never packets).
struct AgentSink {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    events: EventSink<QueuedLines>,
    /// The first event-stream failure (stdout gone): the agent goes on serving metrics.
    events_failed: Option<EventsError>,
    /// Written by the namespace scans: processes whose namespace they could not read.
    netns_unreadable: Arc<AtomicU64>,
}

impl AgentSink {
    fn events(&mut self, f: impl FnOnce(&mut EventSink<QueuedLines>) -> Result<(), EventsError>) {
        if self.events_failed.is_none() {
            if let Err(e) = f(&mut self.events) {
                log::warn!("event stream: {e}; metrics go on");
                self.events_failed = Some(e);
            }
        }
    }
}

impl LiveSink for AgentSink {
    fn started(&mut self, setup: &KernelSetup, now_ns: u64) {
        self.health.set_attached(true);
        self.health.mark_read();
        let unreadable = self.netns_unreadable.load(Ordering::Relaxed);
        self.metrics.set_netns_unreadable(unreadable);
        let mut detail = format!(
            "kernel {} tc {} hooks {}",
            setup.release,
            setup.tc_attach,
            setup.hooks.join(",")
        );
        if unreadable > 0 {
            detail.push_str(&format!(
                "; network namespace of {unreadable} process(es) unreadable (CAP_SYS_PTRACE?): not traced"
            ));
        }
        self.events(|e| e.start(now_ns, Some(detail)));
    }

    fn batch(&mut self, records: &mut Vec<Record>, now_ns: u64) -> std::io::Result<bool> {
        self.health.mark_read();
        for r in records.drain(..) {
            self.metrics.observe(&r);
            if !matches!(r, Record::Packet(_)) {
                self.events(|e| e.observe(&r, now_ns));
            }
        }
        Ok(false)
    }

    fn periodic(&mut self, stats: &StatsRecord, now_ns: u64) {
        self.metrics.observe_stats(stats);
        self.metrics
            .set_netns_unreadable(self.netns_unreadable.load(Ordering::Relaxed));
        self.events(|e| e.observe(&Record::Stats(Box::new(stats.clone())), now_ns));
        self.events(|e| e.tick(now_ns));
        self.metrics.observe_events(self.events.events());
        let sinks = [self.events.out().queue().stats()];
        self.metrics.observe_sinks(&sinks);
    }

    fn finish(&mut self, stats: &StatsRecord, now_ns: u64) -> std::io::Result<()> {
        self.metrics.observe_stats(stats);
        self.health.set_attached(false);
        let detail = stats.stopped_by.clone();
        self.events(|e| e.stop(now_ns, detail));
        let (events, result) = self.events.out().queue().finish(queue::DRAIN_WAIT);
        self.metrics.observe_sinks(&[events]);
        if let (Err(e), None) = (result, &self.events_failed) {
            log::warn!("event stream: {e}");
        }
        Ok(())
    }
}

/// Binds the listener (a taken port is an error before anything is loaded), serves the
/// endpoints, and runs the live pipeline until a signal; then stops the server.
pub async fn run(
    mut opts: AgentOptions,
    out: impl Write + Send + 'static,
) -> Result<TraceSummary, AgentError> {
    opts.trace.attach.all_netns = true;
    opts.trace.view = crate::output::View::Transactions;
    opts.trace.count = None;
    opts.trace.until_loop = false;
    let listener = http::bind(opts.listen).await?;
    let bound = listener.local_addr().unwrap_or(opts.listen);
    eprintln!("dnspath: agent serving /metrics, /healthz, /readyz on http://{bound}");
    let state = AgentState {
        metrics: Arc::new(Metrics::with_config(opts.metrics)),
        health: Arc::new(Health::new(DEFAULT_STALE_AFTER)),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(http::serve_on(listener, state.clone(), async {
        let _ = stop_rx.await;
    }));
    let mut sink = AgentSink {
        metrics: Arc::clone(&state.metrics),
        health: Arc::clone(&state.health),
        events: EventSink::new(
            EventsConfig::default(),
            Clock::boot(),
            QueuedLines::spawn("events", EVENT_LINES, out).map_err(EventsError::from)?,
        ),
        events_failed: None,
        netns_unreadable: Arc::clone(&opts.trace.attach.netns_unreadable),
    };
    let result = match opts.otlp {
        Some(cfg) => match crate::output::otlp::Exporter::start(cfg) {
            Ok(exporter) => {
                let mut otlp = trace::OtlpSink::new(&mut sink, exporter);
                trace::run_live(opts.trace, &mut otlp).await
            }
            Err(e) => {
                log::warn!("{e}; the agent runs without export");
                trace::run_live(opts.trace, &mut sink).await
            }
        },
        None => trace::run_live(opts.trace, &mut sink).await,
    };
    let _ = stop_tx.send(());
    match server.await {
        Ok(Err(e)) => log::warn!("{e}"),
        Err(e) => log::warn!("metrics server: {e}"),
        Ok(Ok(())) => {}
    }
    Ok(result?)
}
