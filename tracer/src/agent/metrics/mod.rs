//! Prometheus metrics of the agent (OpenMetrics text), counted from the pipeline's records.
//!
//! Every label takes its value from a fixed set chosen here (`&'static str`), or — for the
//! kernel's drop reasons, an enum of the running kernel — from a capped set: no pod, address,
//! port or query name ever becomes a label, so the number of series is bounded whatever the
//! traffic. Names follow CoreDNS (`coredns_dns_requests_total`, `…_request_duration_seconds`)
//! and Hubble (`hubble_dns_queries_total`): `dnspath_<subsystem>_<what>_<unit>`. The table is
//! in docs/metrics.md.
mod conntrack;
mod labels;
mod observe;
mod otlp;
mod process;

use std::sync::{Mutex, MutexGuard};

use super::events::EventsConfig;

use prometheus_client::{
    encoding::{prometheus_text, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use labels::{
    latency_family, BuildLabels, CauseLabels, DetectionLabels, DropLabels, EventLabels,
    FindingLabels, KindLabels, LegLabels, QtypeLabels, QueryLabels, ReasonLabels, ResponseLabels,
    SearchLabels, SinkLabels, TableLabels, TransactionLabels,
};

/// What the metrics look like beyond the fixed sets.
#[derive(Clone, Copy, Debug)]
pub struct MetricsConfig {
    /// `--namespace-label`: a `namespace` label on the per-query metrics, with at most this
    /// many distinct namespaces (the rest are `other`); `None`: no such label.
    pub namespace_label: Option<usize>,
    /// The event stream's server cap ([`EventsConfig::max_keys`]), shown as a table cap.
    pub events_servers: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            namespace_label: None,
            // The stream's two maps each add a `*` key beyond it.
            events_servers: EventsConfig::default().max_keys + 2,
        }
    }
}
pub use labels::{
    leg_label, malformed_label, qtype_label, rcode_label, LATENCY_BUCKETS, MAX_DROP_REASONS,
    QTYPES, RCODES,
};
use observe::Memory;

/// The agent's metrics. Shared by reference: `observe` and `encode` take `&self` (the few
/// values kept between records sit behind a mutex held for O(1) work).
#[derive(Debug)]
pub struct Metrics {
    config: MetricsConfig,
    registry: Registry,
    memory: Mutex<Memory>,
    queries: Family<QueryLabels, Counter>,
    responses: Family<ResponseLabels, Counter>,
    unanswered: Family<QueryLabels, Counter>,
    leg_duration: Family<LegLabels, Histogram>,
    transactions: Family<TransactionLabels, Counter>,
    transaction_duration: Family<QtypeLabels, Histogram>,
    retries: Family<CauseLabels, Counter>,
    search_nxdomain: Family<SearchLabels, Counter>,
    kernel_drops: Family<DropLabels, Counter>,
    race_drops: Family<QtypeLabels, Counter>,
    race_suspected: Family<QtypeLabels, Counter>,
    clashes_resolved: Counter,
    loops_detected: Family<KindLabels, Counter>,
    loops_active: Gauge,
    detections: Family<DetectionLabels, Counter>,
    events_lost: Family<EventLabels, Counter>,
    sink_dropped: Family<SinkLabels, Counter>,
    malformed: Family<ReasonLabels, Counter>,
    summarised: Counter,
    packets: Counter,
    evictions: Family<TableLabels, Counter>,
    findings: Family<FindingLabels, Gauge>,
    table_entries: Family<TableLabels, Gauge>,
    netns_unreadable: Gauge,
    fragment_losses: Counter,
    otlp: otlp::OtlpMetrics,
    conntrack: conntrack::ConntrackMetrics,
}

/// Adds to `c` what a running total grew by since `was` (totals kept elsewhere: the OTLP
/// exporter's, the conntrack watchers').
fn add_growth(c: &Counter, now: u64, was: u64) {
    if now > was {
        c.inc_by(now - was);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::with_config(MetricsConfig::default())
    }

    pub fn with_config(config: MetricsConfig) -> Self {
        // The root holds the `process_*` metrics, which keep their common names; every
        // other metric is the agent's own, under `dnspath_`.
        let mut registry = Registry::default();
        let m = Metrics {
            config,
            registry: Registry::default(),
            memory: Mutex::new(Memory::default()),
            queries: Family::default(),
            responses: Family::default(),
            unanswered: Family::default(),
            leg_duration: latency_family(),
            transactions: Family::default(),
            transaction_duration: latency_family(),
            retries: Family::default(),
            search_nxdomain: Family::default(),
            kernel_drops: Family::default(),
            race_drops: Family::default(),
            race_suspected: Family::default(),
            clashes_resolved: Counter::default(),
            loops_detected: Family::default(),
            loops_active: Gauge::default(),
            detections: Family::default(),
            events_lost: Family::default(),
            sink_dropped: Family::default(),
            malformed: Family::default(),
            summarised: Counter::default(),
            fragment_losses: Counter::default(),
            packets: Counter::default(),
            evictions: Family::default(),
            findings: Family::default(),
            table_entries: Family::default(),
            netns_unreadable: Gauge::default(),
            otlp: otlp::OtlpMetrics::default(),
            conntrack: conntrack::ConntrackMetrics::default(),
        };
        registry.register_collector(Box::new(process::ProcessCollector));
        let r = registry.sub_registry_with_prefix("dnspath");
        r.register_collector(Box::new(process::CgroupCollector));
        // A gauge rather than an OpenMetrics `info`: Prometheus' classic text format (what
        // `promtool check metrics` reads) has no info type; CoreDNS does the same.
        let build: Family<BuildLabels, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register("build_info", "dnspath version (always 1)", build);
        r.register(
            "dns_queries",
            "Queries seen, one per leg (a client's query, its DNAT'd delivery, a forwarder's own query)",
            m.queries.clone(),
        );
        r.register(
            "dns_responses",
            "Responses seen, per leg, with the response code",
            m.responses.clone(),
        );
        r.register(
            "dns_unanswered_queries",
            "Queries that got no response (timed out, or dropped by the kernel)",
            m.unanswered.clone(),
        );
        r.register_with_unit(
            "dns_leg_duration",
            "Query to response of one leg, at the interface of its first hop",
            Unit::Seconds,
            m.leg_duration.clone(),
        );
        r.register(
            "dns_transactions",
            "Client questions followed to their end, by outcome (answered, dropped, unanswered, pending)",
            m.transactions.clone(),
        );
        r.register_with_unit(
            "dns_transaction_duration",
            "Client's first query to the answer it got, retries included",
            Unit::Seconds,
            m.transaction_duration.clone(),
        );
        r.register(
            "dns_retries",
            "Queries a client sent again, by cause: timeout, truncated (TCP fallback), conntrack_race, kernel_drop (another drop)",
            m.retries.clone(),
        );
        r.register(
            "dns_search_nxdomain",
            "Search-list steps answered NXDOMAIN before the client tried the next name",
            m.search_nxdomain.clone(),
        );
        r.register(
            "kernel_drops",
            "DNS packets the kernel dropped, by skb drop reason; benign=true for normal socket life",
            m.kernel_drops.clone(),
        );
        r.register(
            "conntrack_race_drops",
            "Queries dropped by the conntrack insert race after DNAT (kubernetes#56903)",
            m.race_drops.clone(),
        );
        r.register(
            "conntrack_race_suspected",
            "Unanswered queries of an A/AAAA pair retried at the timeout, without kernel evidence",
            m.race_suspected.clone(),
        );
        r.register(
            "conntrack_clashes_resolved",
            "Conntrack clashes the kernel resolved (the race happened, nothing was lost)",
            m.clashes_resolved.clone(),
        );
        // Both kinds at 0 from the start: a rate or increase then counts the first loop
        // (a counter's first sample is no increase).
        for kind in [
            crate::detect::loops::LoopKind::Cycle,
            crate::detect::loops::LoopKind::Amplification,
        ] {
            let _ = m.loops_detected.get_or_create(&labels::KindLabels {
                kind: labels::loop_kind_label(kind),
            });
        }
        r.register(
            "forwarding_loops_detected",
            "Forwarding loops detected",
            m.loops_detected.clone(),
        );
        r.register(
            "forwarding_loops_active",
            "Forwarding loops going on now",
            m.loops_active.clone(),
        );
        r.register(
            "events_lost",
            "Packets (event=packet) and drops (event=drop) the kernel matched that never reached dnspath",
            m.events_lost.clone(),
        );
        r.register(
            "sink_dropped",
            "Lines an output of the agent dropped because its reader did not keep up (sink=events: the event stream on stdout)",
            m.sink_dropped.clone(),
        );
        r.register(
            "malformed_messages",
            "Packets or TCP-framed messages that could not be decoded, by reason",
            m.malformed.clone(),
        );
        r.register(
            "detections",
            "Detections reported, by detection (its record's type: loop, race, ...): a loop found, a race drop; not a loop's updates nor a resolved clash",
            m.detections.clone(),
        );
        for detection in crate::detect::Detected::NAMES {
            m.detections
                .get_or_create(&DetectionLabels { detection })
                .inc_by(0);
        }
        r.register(
            "ip_fragment_losses",
            "DNS datagrams whose IP fragments never all reached a hop (large answers lost on the way)",
            m.fragment_losses.clone(),
        );
        r.register(
            "summarised_packets",
            "Packets of a looping question only counted, not decoded (storm shedding, in the kernel or after copying)",
            m.summarised.clone(),
        );
        r.register(
            "packets",
            "Packet events received from the kernel",
            m.packets.clone(),
        );
        r.register(
            "table_evictions",
            "Entries forgotten to keep memory bounded, by table",
            m.evictions.clone(),
        );
        // Every kind at 0 from the start: an alert tells "none" from "not exported".
        for kind in crate::findings::watch::TRAFFIC_KINDS {
            m.findings
                .get_or_create(&FindingLabels {
                    kind: kind.as_str(),
                    severity: kind.severity().as_str(),
                })
                .set(0);
        }
        r.register(
            "findings",
            "Findings of doctor's traffic checks in the last findings window (--findings-window), by kind",
            m.findings.clone(),
        );
        let caps: Family<TableLabels, Gauge> = Family::default();
        for (table, cap) in m.table_caps() {
            caps.get_or_create(&TableLabels { table })
                .set(i64::try_from(cap).unwrap_or(i64::MAX));
        }
        r.register(
            "table_capacity",
            "Most entries the agent's own tables hold (docs/metrics.md lists the pipeline's)",
            caps,
        );
        r.register(
            "table_entries",
            "Entries the agent's own tables hold now",
            m.table_entries.clone(),
        );
        r.register(
            "netns_unreadable_processes",
            "Processes whose network namespace the latest scan could not read (permission denied: CAP_SYS_PTRACE missing); their namespaces are not traced",
            m.netns_unreadable.clone(),
        );
        r.register(
            "otlp_spans_exported",
            "Spans the OTLP backend accepted (--otlp)",
            m.otlp.spans_exported.clone(),
        );
        r.register(
            "otlp_transactions_exported",
            "Transactions whose spans the OTLP backend accepted",
            m.otlp.transactions_exported.clone(),
        );
        r.register(
            "otlp_transactions_dropped",
            "Transactions not exported: queue full (backend slow or down), every attempt failed, or still queued at exit",
            m.otlp.dropped.clone(),
        );
        r.register(
            "otlp_transactions_sampled_out",
            "Transactions left out by --otlp-sample (neither failing nor slow)",
            m.otlp.sampled_out.clone(),
        );
        r.register(
            "otlp_export_requests",
            "Export requests (each attempt) by result",
            m.otlp.requests.clone(),
        );
        r.register(
            "conntrack_events",
            "Conntrack events the watchers read (dump entries included), for joining hops across NAT",
            m.conntrack.events.clone(),
        );
        r.register(
            "conntrack_events_lost",
            "Conntrack events lost (a lower bound): socket overrun (at least one each), malformed, resync dump over its cap, the run loop's queue full",
            m.conntrack.lost.clone(),
        );
        r.register(
            "conntrack_resyncs",
            "Conntrack tables dumped again after an overrun",
            m.conntrack.resyncs.clone(),
        );
        r.register(
            "conntrack_netns_capped",
            "Namespaces whose conntrack is not followed because the watchers follow 1,024 already",
            m.conntrack.netns_capped.clone(),
        );
        r.register(
            "conntrack_netns_changes_lost",
            "Namespaces' appearances and departures lost on the way to the conntrack watchers (queue of 8,192 full); one appeared then is not followed",
            m.conntrack.netns_changes_lost.clone(),
        );
        r.register(
            "conntrack_netns_unfiltered",
            "Namespaces whose conntrack events are all read, for want of the kernel's port filter (a cost, not a loss)",
            m.conntrack.netns_unfiltered.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Processes whose namespace the latest scan could not read
    /// ([`crate::kernel::netns::AllNetns::unreadable`]).
    pub fn set_netns_unreadable(&self, n: u64) {
        self.netns_unreadable
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// What the agent's queued outputs dropped (`dnspath_sink_dropped_total{sink}`): call
    /// it now and then with their running totals.
    pub fn observe_sinks(&self, sinks: &[crate::output::queue::SinkStats]) {
        for s in sinks {
            let c = self
                .sink_dropped
                .get_or_create(&SinkLabels { sink: s.name });
            let was = c.get();
            if s.dropped > was {
                c.inc_by(s.dropped - was);
            }
        }
    }

    fn memory(&self) -> MutexGuard<'_, Memory> {
        // The memory holds counts only: after a panic elsewhere they are still usable.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn encode(&self) -> String {
        self.encode_as(Exposition::OpenMetrics)
    }

    /// The exposition in either text format (a scrape's `Accept` header chooses).
    pub fn encode_as(&self, format: Exposition) -> String {
        for (table, n) in self.table_sizes() {
            self.table_entries
                .get_or_create(&TableLabels { table })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        let encoded = match format {
            Exposition::OpenMetrics => encode(&mut out, &self.registry),
            Exposition::PrometheusText => prometheus_text::encode(&mut out, &self.registry),
        };
        // Writing into a String cannot fail; an error could only come from an encoder, and
        // what was written before it is still the best answer to a scrape.
        if let Err(e) = encoded {
            log::warn!("encoding metrics: {e}");
        }
        out
    }
}

/// The two text formats Prometheus scrapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposition {
    /// OpenMetrics 1.0 text: what Prometheus asks for first.
    OpenMetrics,
    /// Prometheus' classic text format 0.0.4 (`promtool check metrics`, older scrapers).
    PrometheusText,
}

impl Exposition {
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Exposition::PrometheusText => prometheus_text::CONTENT_TYPE,
        }
    }

    /// The format a scrape's `Accept` header asks for: OpenMetrics when it names it (as
    /// Prometheus does), else the classic text format.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Exposition::OpenMetrics,
            _ => Exposition::PrometheusText,
        }
    }
}

/// The content type of [`Metrics::encode`]'s text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests;
