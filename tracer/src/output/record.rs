//! Output records: what sinks write, one per event. Field by field in docs/output.md.
use serde::Serialize;

pub use crate::{
    correlate::record::{
        HopRecord, LegDrop, LegRecord, LookupRef, QuestionRecord, TransactionRecord,
    },
    decode::record::{
        CtEndpoints, CtRecord, DecodeStats, DropRecord, DroppedFragment, FragmentLossRecord,
        FragmentRange, KernelStats, MissingRange, PacketRecord, PodRef, RecordKind,
    },
    detect::{Detected, Detection},
};
use crate::{
    correlate::{CorrelateReport, CorrelateStats},
    decode::{dns::RrType, record::DecodeReport},
    detect::DetectStats,
    names::Names,
    output::summary::SummaryRecord,
};

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Record {
    Packet(PacketRecord),
    // The larger records are boxed: every record moves at a packet record's size through
    // the stages' hand-overs (736 bytes a record, for all of them, when stats were inline).
    Drop(Box<DropRecord>),
    Transaction(Box<TransactionRecord>),
    #[serde(rename = "fragment_loss")]
    FragmentLoss(Box<FragmentLossRecord>),
    Stats(Box<StatsRecord>),
    /// What happened to DNS in the run: written once, just before `stats` (JSON).
    Summary(Box<SummaryRecord>),
    /// A detection's record (a loop, a race, …), under its own `type`.
    #[serde(untagged)]
    Detected(Detected),
}

/// Totals; written once, at the end of the run (the agent folds them into its metrics every
/// second instead). In JSON one flat object: the decode stage's counters, then the rest.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StatsRecord {
    #[serde(flatten)]
    pub decode: DecodeStats,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlate: Option<CorrelateStats<DetectStats>>,
    /// Live: packet records decided after `--count` was reached (in the batch of the stop):
    /// decoded and counted above, not written.
    pub not_written: u64,
    /// Live: packets the kernel matched (`kernel.packets_matched`) that were neither read,
    /// lost nor shed: still queued in the ring buffer, or matched while detaching, when the run
    /// stopped (a `--count` stop leaves the queue unread).
    pub unread: u64,
    /// Live: why the run ended: `SIGINT`, `SIGTERM`, `SIGHUP`, `duration`, `count`, `loop`
    /// (`--until loop`), `error`; absent offline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    /// Live, with `-w` or `--record`: what went into pcapng files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<crate::output::evidence::EvidenceStats>,
    /// Live: each output behind its bounded queue (`output/queue.rs`): records written, and
    /// dropped because its reader did not keep up.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sinks: Vec<SinkStats>,
    /// Live, with `--otlp`: what the exporter sent and lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp: Option<OtlpStats>,
    /// Live: of `drops`, those read from the reserve ring: the kernel found the ring buffer
    /// full and put them there instead of losing them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drops_reserve: Option<u64>,
    /// Live, with transactions: what the conntrack watchers read and lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conntrack: Option<crate::conntrack::ConntrackStats>,
    /// Live, with transactions: ports pods redirect DNS to, captured in their namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learnt_ports: Option<LearntPortStats>,
    /// `trace -o json` and `analyze -o json`: the run's summary, which the writer writes as a
    /// `summary` record before this one (not a field of it).
    #[serde(skip)]
    pub summary: Option<Box<SummaryRecord>>,
}

/// Ports a watched one is redirected to within a pod (its DNS proxy), each captured in that
/// pod's namespace only (`stats.learnt_ports`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LearntPortStats {
    /// (namespace, port) pairs captured when the record was made.
    pub captured: u64,
    /// Pairs learnt over the run, and of them those forgotten with their namespace.
    pub learnt: u64,
    pub forgotten: u64,
    /// Redirects not learnt because the most pairs (64) were.
    pub refused: u64,
}

/// What one queued sink did (`stats.sinks`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SinkStats {
    /// Which sink: `output` (trace's text/NDJSON), `events` (the agent's event stream).
    pub name: &'static str,
    /// Items (records, lines) written.
    pub written: u64,
    /// Items not written: handed over while the queue was full (the reader was not keeping
    /// up), or still queued when the wait at the end ran out.
    pub dropped: u64,
}

/// What the exporter did, for the final `stats` record (`otlp`) and the agent's metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OtlpStats {
    /// Transactions whose spans the backend accepted, and those spans.
    pub transactions_exported: u64,
    pub spans_exported: u64,
    /// Not kept by `--otlp-sample` (neither failing nor slow).
    pub sampled_out: u64,
    /// Dropped because the queue was full (the backend slow or down for a while).
    pub dropped_queue_full: u64,
    /// Dropped after every attempt to send them failed.
    pub dropped_export_failed: u64,
    /// Still queued or being sent when the run's flush time was over.
    pub dropped_at_exit: u64,
    /// Requests sent, and those that failed (each attempt counts).
    pub requests: u64,
    pub request_failures: u64,
}

impl Record {
    /// A detection's record.
    pub fn detected(r: impl Into<Detected>) -> Self {
        Record::Detected(r.into())
    }

    /// What every kind answers the sinks (filter, pod annotation): the one place that
    /// matches on the kind for them.
    pub fn kind(&self) -> &dyn RecordKind {
        match self {
            Record::Packet(p) => p,
            Record::Drop(d) => &**d,
            Record::Transaction(t) => &**t,
            Record::FragmentLoss(f) => &**f,
            Record::Stats(s) => &**s,
            Record::Summary(s) => &**s,
            Record::Detected(d) => d.get(),
        }
    }

    /// [`Record::kind`], to change.
    pub fn kind_mut(&mut self) -> &mut dyn RecordKind {
        match self {
            Record::Packet(p) => p,
            Record::Drop(d) => &mut **d,
            Record::Transaction(t) => &mut **t,
            Record::FragmentLoss(f) => &mut **f,
            Record::Stats(s) => &mut **s,
            Record::Summary(s) => &mut **s,
            Record::Detected(d) => d.get_mut(),
        }
    }
}

/// Counters are never filtered, and name no pod.
impl RecordKind for StatsRecord {
    fn is_filtered(&self) -> bool {
        false
    }
    fn any_pod(&self, _f: &mut dyn FnMut(&PodRef) -> bool) -> bool {
        false
    }
    fn any_question(&self, _f: &mut dyn FnMut(&str, RrType) -> bool) -> bool {
        false
    }
    fn is_failure(&self) -> bool {
        false
    }
    fn annotate_pods(&mut self, _names: &Names) {}
}

impl From<DecodeReport> for Record {
    fn from(d: DecodeReport) -> Self {
        match d {
            DecodeReport::Packet(p) => Record::Packet(p),
            DecodeReport::Drop(d) => Record::Drop(Box::new(d)),
            DecodeReport::FragmentLoss(l) => Record::FragmentLoss(Box::new(l)),
        }
    }
}

impl From<CorrelateReport<Detected>> for Record {
    fn from(r: CorrelateReport<Detected>) -> Self {
        match r {
            CorrelateReport::Transaction(t) => Record::Transaction(Box::new(t)),
            CorrelateReport::Detected(d) => Record::Detected(d),
        }
    }
}

impl StatsRecord {
    /// The decode stage's counters with the correlate stage's, if it ran. The run's own
    /// (`not_written`, `unread`, `stopped_by`, `evidence`) are set by a live run when it ends.
    pub fn new(decode: DecodeStats, correlate: Option<CorrelateStats<DetectStats>>) -> Self {
        Self {
            decode,
            correlate,
            ..Self::default()
        }
    }
}
