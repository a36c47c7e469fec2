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
    engine::{self, LiveError, LiveSummary, RunOptions},
    event::KernelSetup,
    output::{
        otlp::OtlpSink,
        queue::{self, QueuedLines},
        record::{Record, StatsRecord},
        sink::{Batch, Sink, Sinks, Wants},
    },
    runner::stop::StopPolicy,
    time::Clock,
};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Live(#[from] LiveError),
    #[error("event stream: {0}")]
    Events(#[from] EventsError),
}

pub struct AgentOptions {
    /// What to capture ([`RunOptions::node_wide`]); the agent forces `--all-netns` and
    /// transactions (the metrics come from them).
    pub trace: RunOptions,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub listen: SocketAddr,
    pub metrics: MetricsConfig,
    /// `--otlp`: transactions also exported as spans (docs/otlp.md).
    pub otlp: Option<crate::output::otlp::OtlpConfig>,
    /// The event stream's windows (`--findings-window`).
    pub events: EventsConfig,
}

/// Event lines the stream's queue holds while stdout's reader is slow.
const EVENT_LINES: usize = 4_096;

/// The agent's metrics, a sink of the list: every record counted (borrowed, never
/// copied), the running totals, health.
struct MetricsSink {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// Written by the namespace scans: processes whose namespace they could not read.
    netns_unreadable: Arc<AtomicU64>,
}

impl Sink for MetricsSink {
    /// A transaction's client and drops only ([`Metrics::observe`]).
    fn wants(&self) -> Wants {
        Wants {
            hop_pods: false,
            ..Wants::default()
        }
    }

    fn started(&mut self, _setup: &KernelSetup, _now_ns: u64) {
        self.health.set_attached(true);
        self.health.mark_read();
        self.metrics
            .set_netns_unreadable(self.netns_unreadable.load(Ordering::Relaxed));
    }

    fn batch(&mut self, batch: Batch<'_>) -> std::io::Result<()> {
        self.health.mark_read();
        for r in batch.records {
            self.metrics.observe(r);
        }
        Ok(())
    }

    fn periodic(&mut self, stats: &StatsRecord, _now_ns: u64) {
        self.metrics.observe_stats(stats);
        self.metrics
            .set_netns_unreadable(self.netns_unreadable.load(Ordering::Relaxed));
    }

    fn finish(&mut self, stats: &mut StatsRecord, _now_ns: u64) -> std::io::Result<()> {
        self.metrics.observe_stats(stats);
        self.health.set_attached(false);
        Ok(())
    }
}

/// The agent's event stream, a sink of the list: the records people act on, whose lines a
/// thread writes behind a bounded queue (a slow log reader costs lines, counted in
/// `dnspath_sink_dropped_total{sink="events"}`, never packets). Its own counts go to the
/// metrics.
struct EventsSink {
    metrics: Arc<Metrics>,
    events: EventSink<QueuedLines>,
    /// The first event-stream failure (stdout gone): the agent goes on serving metrics.
    events_failed: Option<EventsError>,
    netns_unreadable: Arc<AtomicU64>,
}

impl EventsSink {
    fn events(&mut self, f: impl FnOnce(&mut EventSink<QueuedLines>) -> Result<(), EventsError>) {
        if self.events_failed.is_none() {
            if let Err(e) = f(&mut self.events) {
                log::warn!("event stream: {e}; metrics go on");
                self.events_failed = Some(e);
            }
        }
    }
}

impl Sink for EventsSink {
    /// A transaction's client and drops only (its findings).
    fn wants(&self) -> Wants {
        Wants {
            hop_pods: false,
            ..Wants::default()
        }
    }

    fn started(&mut self, setup: &KernelSetup, now_ns: u64) {
        let unreadable = self.netns_unreadable.load(Ordering::Relaxed);
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

    fn batch(&mut self, batch: Batch<'_>) -> std::io::Result<()> {
        for r in batch.records {
            if !matches!(r, Record::Packet(_)) {
                self.events(|e| e.observe(r, batch.now_ns));
            }
        }
        Ok(())
    }

    fn periodic(&mut self, stats: &StatsRecord, now_ns: u64) {
        self.events(|e| e.observe(&Record::Stats(Box::new(stats.clone())), now_ns));
        self.events(|e| e.tick(now_ns));
        self.metrics.observe_events(self.events.events());
        let sinks = [self.events.out().queue().stats()];
        self.metrics.observe_sinks(&sinks);
    }

    fn finish(&mut self, stats: &mut StatsRecord, now_ns: u64) -> std::io::Result<()> {
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
) -> Result<LiveSummary, AgentError> {
    // Every namespace of the node, unless named ones were asked for (`--netns`, a lab aid).
    opts.trace.attach.all_netns = opts.trace.attach.netns.is_empty();
    opts.trace.transactions = true;
    let listener = http::bind(opts.listen).await?;
    let bound = listener.local_addr().unwrap_or(opts.listen);
    eprintln!("dnspath: agent serving /metrics, /healthz, /readyz on http://{bound}");
    let state = AgentState {
        metrics: Arc::new(Metrics::with_config(opts.metrics)),
        health: Arc::new(Health::new(DEFAULT_STALE_AFTER)),
    };
    let server = http::spawn_server(listener, state.clone())?;
    let netns_unreadable = Arc::clone(&opts.trace.attach.netns_unreadable);
    let mut sinks = Sinks::new();
    if let Some(cfg) = opts.otlp {
        match crate::output::otlp::Exporter::start(cfg) {
            Ok(exporter) => sinks.push(Box::new(OtlpSink::new(exporter))),
            Err(e) => log::warn!("{e}; the agent runs without export"),
        }
    }
    sinks.push(Box::new(MetricsSink {
        metrics: Arc::clone(&state.metrics),
        health: Arc::clone(&state.health),
        netns_unreadable: Arc::clone(&netns_unreadable),
    }));
    sinks.push(Box::new(EventsSink {
        metrics: Arc::clone(&state.metrics),
        events: EventSink::new(
            opts.events,
            Clock::boot(),
            QueuedLines::spawn("events", EVENT_LINES, out).map_err(EventsError::from)?,
        ),
        events_failed: None,
        netns_unreadable,
    }));
    let result = engine::run_live(opts.trace, &mut sinks, &mut StopPolicy::default()).await;
    if let Err(e) = server.stop().await {
        log::warn!("{e}");
    }
    Ok(result?)
}

#[cfg(test)]
#[path = "cost_tests.rs"]
mod cost_tests;
