//! Output records: what sinks write, one per event. Field by field in docs/output.md.
use serde::Serialize;

pub use crate::{
    correlate::record::{
        HopRecord, LegDrop, LegRecord, LookupRef, QuestionRecord, TransactionRecord,
    },
    decode::record::{
        CtEndpoints, CtRecord, DropRecord, DroppedFragment, FragmentLossRecord, FragmentRange,
        KernelStats, MissingRange, PacketRecord, PodRef,
    },
};
use crate::{
    correlate::{loops::LoopRecord, race::RaceRecord, CorrelateReport, CorrelateStats},
    decode::record::{DecodeReport, DecodeStats},
};

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Record {
    Packet(PacketRecord),
    Drop(DropRecord),
    Transaction(TransactionRecord),
    Loop(LoopRecord),
    Race(RaceRecord),
    #[serde(rename = "fragment_loss")]
    FragmentLoss(FragmentLossRecord),
    Stats(StatsRecord),
}

/// Totals; written once, at the end of the run (the agent folds them into its metrics every
/// second instead).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StatsRecord {
    /// Packet events received from the source.
    pub packets: u64,
    /// DNS messages decoded whole (UDP packets, and messages framed out of TCP streams: a
    /// segment can hold several, or part of one).
    pub decoded: u64,
    /// Packets or TCP-framed messages that could not be decoded: wrong in themselves.
    pub malformed: u64,
    /// DNS messages the capture (snaplen) cut: decoded as far as their bytes go. Neither in
    /// `decoded` nor in `malformed`.
    pub capture_truncated: u64,
    /// TCP segments with no DNS bytes (handshake, ACK, FIN).
    pub tcp_control: u64,
    /// TCP segments with DNS stream bytes. Their bytes end in messages (`tcp_messages`).
    pub tcp_data: u64,
    /// Of `decoded` + `capture_truncated` + `malformed`, the messages framed out of TCP
    /// streams (including a stream's unfinished message reported when it ended or was
    /// evicted). Every packet counts once:
    /// `packets = decoded + capture_truncated + malformed - tcp_messages + tcp_control
    /// + tcp_data + other + summarised`.
    pub tcp_messages: u64,
    /// Captured packets of other protocols / non-first fragments (should be 0 live).
    pub other: u64,
    /// Packets the kernel matched but userspace never got (ring buffer full, copy failure,
    /// unreadable records).
    pub lost: u64,
    /// Drop events received.
    pub drops: u64,
    /// Of `drops`, those that are normal socket life (`benign` set).
    pub drops_benign: u64,
    /// Drops in namespaces not being traced (not shown).
    pub drops_unwatched: u64,
    /// Drops the kernel matched but could not report.
    pub drops_lost: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlate: Option<CorrelateStats>,
    /// UDP packets of a question in an active forwarding loop that were only counted, not
    /// decoded or correlated (storm shedding; see docs/output.md).
    pub summarised: u64,
    /// Live: UDP packets of a looping question the kernel only counted and never copied
    /// (storm shedding in the TC programs; not part of `packets`). Equals
    /// `kernel.counters.packets_shed` in the final record.
    pub shed: u64,
    pub tcp_flows_evicted: u64,
    pub tcp_bytes_dropped: u64,
    /// Holes in TCP streams given up on (a segment lost or not captured): their held bytes
    /// are in `tcp_bytes_dropped`, each is a `malformed` record.
    pub tcp_gaps: u64,
    /// TCP messages the capture (snaplen) cut inside a segment, decoded as far as they go.
    pub tcp_cut: u64,
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
    /// IP fragments merged into a reassembled datagram (the fragment completing it counts
    /// as that datagram: `decoded`, `malformed`, …).
    pub fragments_merged: u64,
    /// IP fragments of datagrams that never completed (a fragment lost, memory bound, or an
    /// unusable datagram).
    pub fragments_incomplete: u64,
    /// IP fragments still held for datagrams being reassembled when this record was made
    /// (0 in the final record: the end of input gives up on them).
    pub fragments_pending: u64,
    pub datagrams_reassembled: u64,
    /// Incomplete datagrams reported as `fragment_loss` records.
    pub datagrams_lost: u64,
    /// Incomplete datagrams forgotten to bound memory (not reported).
    pub datagrams_evicted: u64,
    /// Live, with `-w` or `--record`: what went into pcapng files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<crate::output::annotate::EvidenceStats>,
}

impl From<DecodeReport> for Record {
    fn from(d: DecodeReport) -> Self {
        match d {
            DecodeReport::Packet(p) => Record::Packet(p),
            DecodeReport::Drop(d) => Record::Drop(d),
            DecodeReport::FragmentLoss(l) => Record::FragmentLoss(l),
        }
    }
}

impl From<CorrelateReport> for Record {
    fn from(r: CorrelateReport) -> Self {
        match r {
            CorrelateReport::Transaction(t) => Record::Transaction(t),
            CorrelateReport::Loop(l) => Record::Loop(l),
            CorrelateReport::Race(r) => Record::Race(r),
        }
    }
}

impl StatsRecord {
    /// The decode stage's counters with the correlate stage's, if it ran.
    pub fn new(d: DecodeStats, correlate: Option<CorrelateStats>) -> Self {
        let DecodeStats {
            packets,
            decoded,
            malformed,
            capture_truncated,
            tcp_control,
            tcp_data,
            tcp_messages,
            other,
            lost,
            drops,
            drops_benign,
            drops_unwatched,
            drops_lost,
            kernel,
            summarised,
            shed,
            tcp_flows_evicted,
            tcp_bytes_dropped,
            tcp_gaps,
            tcp_cut,
            fragments_merged,
            fragments_incomplete,
            fragments_pending,
            datagrams_reassembled,
            datagrams_lost,
            datagrams_evicted,
        } = d;
        Self {
            packets,
            decoded,
            malformed,
            capture_truncated,
            tcp_control,
            tcp_data,
            tcp_messages,
            other,
            lost,
            drops,
            drops_benign,
            drops_unwatched,
            drops_lost,
            kernel,
            correlate,
            summarised,
            shed,
            tcp_flows_evicted,
            tcp_bytes_dropped,
            tcp_gaps,
            tcp_cut,
            // Set by a live run when it ends.
            not_written: 0,
            unread: 0,
            stopped_by: None,
            evidence: None,
            fragments_merged,
            fragments_incomplete,
            fragments_pending,
            datagrams_reassembled,
            datagrams_lost,
            datagrams_evicted,
        }
    }
}
