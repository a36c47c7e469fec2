//! What the decode stage reports: packet, drop and fragment-loss records (written as they
//! are by the sinks; field by field in docs/output.md).
use std::sync::Arc;

use serde::Serialize;

/// The transport as records write it: sources below the decode stage name it too
/// (a capture file's conntrack tuples), so it is defined with what they hand over.
pub use crate::event::Proto;
/// `Names` for the later stages' records to fill in their pods ([`RecordKind::annotate_pods`]):
/// names sit below every stage, reached like `PodRef` through the records' own module.
pub use crate::names::{Names, PodRef};
use crate::{
    decode::{
        dns::{DnsMessage, RrType},
        ip::Endpoint,
        tunnel::Tunnel,
    },
    event::{Direction, KernelCounters, KernelSetup},
    time::WallTime,
};

/// What the sinks ask of every kind of output record, answered next to the type that
/// defines it (`output::record::Record::kind` hands it out): a new kind implements this in
/// its own file, and the filter (`output/filter.rs`), the pod annotation (`output/pods.rs`)
/// and the flight recorder (`evidence/live.rs`) need no arm for it. The `any_*` methods call `f` on each value until it
/// returns true and say whether it did, so that the filter looks at a record without
/// collecting anything.
pub trait RecordKind {
    /// Whether the filter flags apply to it at all (the stats record is always written).
    fn is_filtered(&self) -> bool {
        true
    }
    /// The pods it names (what `--pod` and `--namespace` match).
    fn any_pod(&self, f: &mut dyn FnMut(&PodRef) -> bool) -> bool;
    /// Its questions as name and type (what `--name` and `--qtype` match).
    fn any_question(&self, f: &mut dyn FnMut(&str, RrType) -> bool) -> bool;
    /// The response codes it carries (what `--rcode` matches); none by default.
    fn any_rcode(&self, _f: &mut dyn FnMut(&str) -> bool) -> bool {
        false
    }
    /// Whether it shows something failing (what `--failures` keeps).
    fn is_failure(&self) -> bool;
    /// Whether it took longer than `limit_ns` (what `--slower-than` keeps); a record with no
    /// duration never does.
    fn slower_than(&self, _limit_ns: u64) -> bool {
        false
    }
    /// Fills in its pod fields where `names` knows the pod.
    fn annotate_pods(&mut self, names: &Names);
    /// Whether it is an incident whose packets the flight recorder keeps (`--record`), and
    /// what it says of it; none by default.
    fn incident(&self) -> Option<Incident> {
        None
    }
    /// Names the flight-recorder file holding its incident's packets (its `evidence`
    /// field), or none where the recorder keeps none; only called where
    /// [`RecordKind::incident`] gave one.
    fn set_evidence(&mut self, _file: Option<String>) {}
}

/// An incident the flight recorder keeps the packets around (`--record`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incident {
    /// What it is, in the file's name: `loop`, `race-drop`, `drop`, `unanswered`, `late`,
    /// `servfail`.
    pub kind: &'static str,
    /// One line about it, for the recorder's index.
    pub detail: String,
    /// When it happened: the packets kept are those around it.
    pub ts_ns: u64,
}

/// The questions of a record's DNS message, if it has one.
fn any_question_of(dns: Option<&DnsMessage>, f: &mut dyn FnMut(&str, RrType) -> bool) -> bool {
    dns.is_some_and(|m| m.questions.iter().any(|q| f(&q.name, q.qtype)))
}

/// The rcode of a record's DNS message when it is a response: a query's rcode field says
/// nothing.
fn response_rcode(dns: Option<&DnsMessage>) -> Option<&str> {
    dns.filter(|m| m.qr).map(|m| &*m.rcode)
}

/// One DNS message (or one packet that should have carried one) at one observation point.
/// Built for every packet, so what is there only to be shown is kept cheap (addresses and
/// time as numbers, names and pod shared) and written out only when a sink shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PacketRecord {
    pub ts_ns: u64,
    /// Wall-clock time, written RFC 3339 UTC.
    pub time: WallTime,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    pub netns: Arc<str>,
    pub netns_cookie: u64,
    pub ifname: Arc<str>,
    pub ifindex: u32,
    /// `None`: no pod known (every pod field left out).
    #[serde(flatten)]
    pub pod: Option<Arc<PodRef>>,
    pub dir: Direction,
    pub proto: Proto,
    pub src: Endpoint,
    pub dst: Endpoint,
    /// Packet length from the IP header on.
    pub len: u32,
    /// Bytes captured from the IP header on.
    pub caplen: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// The tunnel the packet was captured in (VXLAN, Geneve, GRE, IP-in-IP): its kind, VNI or
    /// key, and the outer addresses; `src`/`dst` are then the inner packet's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<Arc<Tunnel>>,
    pub dns: Option<Arc<DnsMessage>>,
    /// Why `dns` is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub malformed: Option<String>,
    /// The capture (snaplen) cut the DNS message: `dns` holds what was decoded of it (its
    /// `cut` says what was not), or is null when not even the header was captured.
    #[serde(skip_serializing_if = "crate::names::is_false")]
    pub capture_truncated: bool,
}

/// The pod of a record that may have none.
pub(crate) fn pod_or_none(pod: &Option<Arc<PodRef>>) -> &PodRef {
    pod.as_deref().unwrap_or(&PodRef::NONE)
}

impl PacketRecord {
    /// The pod where it was seen (all fields unset where none is known).
    pub fn pod_ref(&self) -> &PodRef {
        pod_or_none(&self.pod)
    }
}

impl DropRecord {
    /// The pod where it was dropped (all fields unset where none is known).
    pub fn pod_ref(&self) -> &PodRef {
        pod_or_none(&self.pod)
    }
}

impl FragmentLossRecord {
    /// The pod of the hop (all fields unset where none is known).
    pub fn pod_ref(&self) -> &PodRef {
        pod_or_none(&self.pod)
    }
}

/// What packets and drops answer alike: the pod where they were seen, and the questions and
/// response code of their DNS message. Per packet: a shared pod, not a copy of its names.
macro_rules! seen_message {
    () => {
        fn any_pod(&self, f: &mut dyn FnMut(&PodRef) -> bool) -> bool {
            f(self.pod_ref())
        }
        fn any_question(&self, f: &mut dyn FnMut(&str, RrType) -> bool) -> bool {
            any_question_of(self.dns.as_deref(), f)
        }
        fn any_rcode(&self, f: &mut dyn FnMut(&str) -> bool) -> bool {
            response_rcode(self.dns.as_deref()).is_some_and(f)
        }
        fn annotate_pods(&mut self, names: &Names) {
            self.pod = names.pod_ref_at(&self.netns, &self.ifname).cloned();
        }
    };
}

impl RecordKind for PacketRecord {
    seen_message!();
    fn is_failure(&self) -> bool {
        self.dns
            .as_deref()
            .is_some_and(|m| m.qr && m.rcode.is_failure())
    }
}

/// A drop is a failure; one of a DNS message, not part of normal socket life, is an
/// incident.
impl RecordKind for DropRecord {
    seen_message!();
    fn is_failure(&self) -> bool {
        true
    }
    fn incident(&self) -> Option<Incident> {
        (self.benign.is_none() && self.dns.is_some()).then(|| Incident {
            kind: "drop",
            detail: format!(
                "{}@{} {} -> {} in {}/{}",
                self.reason, self.location, self.src, self.dst, self.netns, self.ifname
            ),
            ts_ns: self.ts_ns,
        })
    }
    fn set_evidence(&mut self, file: Option<String>) {
        self.evidence = file;
    }
}

/// A large answer lost on the way: a failure, shown like a drop.
impl RecordKind for FragmentLossRecord {
    fn any_pod(&self, f: &mut dyn FnMut(&PodRef) -> bool) -> bool {
        f(self.pod_ref())
    }
    fn any_question(&self, f: &mut dyn FnMut(&str, RrType) -> bool) -> bool {
        any_question_of(self.dns.as_ref(), f)
    }
    fn is_failure(&self) -> bool {
        true
    }
    fn annotate_pods(&mut self, names: &Names) {
        self.pod = names.pod_ref_at(&self.netns, &self.ifname).cloned();
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct CtEndpoints {
    pub src: String,
    pub dst: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct CtRecord {
    /// `enum ip_conntrack_status` bits.
    pub status: u64,
    pub status_flags: Vec<&'static str>,
    pub confirmed: bool,
    pub orig: CtEndpoints,
    pub reply: CtEndpoints,
}

/// An IP datagram some of whose fragments never came, at one hop (docs/output.md).
#[derive(Clone, Debug, Serialize)]
pub struct FragmentLossRecord {
    /// The last fragment seen.
    pub ts_ns: u64,
    pub time: WallTime,
    pub first_ts_ns: u64,
    pub netns: Arc<str>,
    pub netns_cookie: u64,
    pub ifname: Arc<str>,
    pub ifindex: u32,
    /// The pod of the hop where the fragments went missing, where known.
    #[serde(flatten)]
    pub pod: Option<Arc<PodRef>>,
    pub dir: Direction,
    pub proto: String,
    pub src: String,
    pub dst: String,
    pub ip_id: u32,
    /// `timeout` or `end of input`.
    pub cause: &'static str,
    pub fragments_seen: Vec<FragmentRange>,
    pub missing: Vec<MissingRange>,
    /// Payload length of the datagram, if its last fragment was seen.
    pub total_len: Option<usize>,
    /// Fragment count and the (1-based) numbers never seen, when the layout tells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fragments: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_fragments: Option<Vec<usize>>,
    /// The DNS header and question of the first fragment, as far as it goes.
    pub dns: Option<DnsMessage>,
    pub summary: String,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct FragmentRange {
    pub offset: usize,
    pub len: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MissingRange {
    pub start: usize,
    /// `null`: to the unknown end of the datagram.
    pub end: Option<usize>,
}

impl FragmentLossRecord {
    /// What never came, as the part of the datagram a leg lost.
    pub fn part(&self) -> DroppedPart {
        DroppedPart {
            ip_id: self.ip_id,
            fragments: self.fragments.filter(|_| self.missing_fragments.is_some()),
            numbers: self.missing_fragments.clone().unwrap_or_default(),
            bytes: self.missing.clone(),
            total_len: self.total_len,
        }
    }

    /// What never came, in a few words: `fragment 2 of 3 never seen`, or byte ranges.
    pub fn what_missing(&self) -> String {
        match (self.fragments, &self.missing_fragments) {
            (Some(n), Some(m)) => format!(
                "fragment {} of {n} never seen",
                m.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            _ => format!(
                "bytes {} never seen",
                self.missing
                    .iter()
                    .map(|r| match r.end {
                        Some(e) => format!("{}-{e}", r.start),
                        None => format!("{}-end", r.start),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    pub fn new(
        l: &crate::decode::frag::FragmentLoss,
        netns: Arc<str>,
        ifname: Arc<str>,
        time: WallTime,
    ) -> Self {
        let numbers = l.fragment_numbers();
        let proto = match Proto::from_number(l.key.proto) {
            Proto::Ip => format!("proto {}", l.key.proto),
            p => p.as_str().to_string(),
        };
        let what = match &l.dns {
            Some(m) => {
                let q = m
                    .questions
                    .first()
                    .map(|q| format!(" {}? {}", q.qtype, q.name))
                    .unwrap_or_default();
                format!("{} {}{q}", if m.qr { "answer" } else { "query" }, m.id)
            }
            None => "datagram (first fragment not seen)".to_string(),
        };
        let ranges = |v: &mut dyn Iterator<Item = String>| v.collect::<Vec<_>>().join(", ");
        let missing = ranges(&mut l.missing.iter().map(|(s, e)| match e {
            Some(e) => format!("{s}-{e}"),
            None => format!("{s}-end"),
        }));
        let seen = ranges(&mut l.seen.iter().map(|(o, n)| format!("{o}-{}", o + n)));
        let summary = match &numbers {
            Some((count, miss)) => format!(
                "{what} of {count} fragments: fragment {} never seen (bytes {missing}); seen bytes {seen}",
                miss.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            ),
            None => format!("{what}: bytes {missing} never seen; seen bytes {seen}"),
        };
        Self {
            ts_ns: l.last_ts_ns,
            time,
            first_ts_ns: l.first_ts_ns,
            netns,
            netns_cookie: l.key.at.netns,
            ifname,
            ifindex: l.key.at.ifindex,
            pod: None,
            dir: l.key.at.dir,
            proto,
            src: l.src(),
            dst: l.dst(),
            ip_id: l.key.id,
            cause: l.cause.as_str(),
            fragments_seen: l
                .seen
                .iter()
                .map(|&(offset, len)| FragmentRange { offset, len })
                .collect(),
            missing: l
                .missing
                .iter()
                .map(|&(start, end)| MissingRange { start, end })
                .collect(),
            total_len: l.total_len,
            fragments: numbers.as_ref().map(|n| n.0),
            missing_fragments: numbers.map(|n| n.1),
            dns: l.dns.clone(),
            summary,
        }
    }
}

/// A port-53 packet freed by the kernel with a drop reason.
#[derive(Clone, Debug, Serialize)]
pub struct DropRecord {
    pub ts_ns: u64,
    pub time: WallTime,
    pub cpu: u32,
    pub netns: Arc<str>,
    pub netns_cookie: u64,
    pub ifname: Arc<str>,
    pub ifindex: u32,
    /// `None`: no pod known (every pod field left out).
    #[serde(flatten)]
    pub pod: Option<Arc<PodRef>>,
    /// `enum skb_drop_reason` name without the SKB_DROP_REASON_ prefix; `UNKNOWN` on kernels
    /// whose drop tracepoint has no reason (< 5.17).
    pub reason: String,
    /// Its value on this kernel; `null` where the kernel gives none.
    pub reason_code: Option<u32>,
    /// Where the conntrack-confirm kprobes are loaded: whether conntrack failed to insert
    /// this packet's entry just before (`__nf_conntrack_confirm` returned `NF_DROP`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirm_failed: Option<bool>,
    /// Symbolised kernel location, e.g. `nf_hook_slow+0x9e`.
    pub location: String,
    pub proto: Proto,
    pub src: String,
    pub dst: String,
    pub len: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ct: Option<CtRecord>,
    pub dns: Option<Arc<DnsMessage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub malformed: Option<String>,
    /// As for packets: the copy of the dropped packet cut its DNS message.
    #[serde(skip_serializing_if = "crate::names::is_false")]
    pub capture_truncated: bool,
    /// The dropped packet is an IP fragment: where it sits in its datagram. For a later
    /// fragment (no ports of its own), `src`/`dst` ports and `dns` are its datagram's first
    /// fragment's, when that was seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fragment: Option<DroppedFragment>,
    /// Set when the drop is part of normal socket life (e.g. a socket closed with data
    /// queued), with the reason; the text view hides these.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub benign: Option<&'static str>,
    /// `--record`: the flight-recorder file holding this incident's packets (written once its
    /// window is over).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
}

/// An IP fragment's place in its datagram.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DroppedFragment {
    /// The IP Identification shared by the datagram's fragments.
    pub ip_id: u32,
    /// Byte offset of its data in the datagram's IP payload (0: the first fragment).
    pub offset: usize,
    /// Its data length.
    pub len: usize,
    /// Which fragment it is (1-based) and of how many, when its datagram's first fragment
    /// was seen (or is this one) and the fragments follow the usual layout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub number: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fragments: Option<usize>,
    /// The datagram's IP payload length (UDP header and message), from the first
    /// fragment's UDP header, when it was seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_len: Option<usize>,
}

impl DroppedFragment {
    /// This fragment as the part of its datagram a drop took.
    pub fn part(&self) -> DroppedPart {
        DroppedPart {
            ip_id: self.ip_id,
            fragments: self.number.and(self.fragments),
            numbers: self.number.into_iter().collect(),
            bytes: vec![MissingRange {
                start: self.offset,
                end: Some(self.offset + self.len),
            }],
            total_len: self.total_len,
        }
    }
}

/// What of an IP-fragmented answer never reached where it was going: the fragments the
/// kernel dropped, or that never came (a leg's `drop.fragments`, docs/output.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DroppedPart {
    /// The IP Identification shared by the datagram's fragments.
    pub ip_id: u32,
    /// How many fragments the datagram had, when the layout tells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fragments: Option<usize>,
    /// The 1-based numbers of the fragments lost, in order, when the layout tells.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub numbers: Vec<usize>,
    /// The byte ranges of the datagram's IP payload lost, in order (`end` null: to its
    /// unknown end).
    pub bytes: Vec<MissingRange>,
    /// The datagram's IP payload length (the UDP header and the whole message), when known.
    pub total_len: Option<usize>,
}

impl DroppedPart {
    /// Another fragment of the same datagram lost too: both in one. A part of another
    /// datagram (another IP id) is not merged.
    pub fn merge(&mut self, other: &DroppedPart) {
        if other.ip_id != self.ip_id {
            return;
        }
        self.fragments = self.fragments.or(other.fragments);
        self.total_len = self.total_len.or(other.total_len);
        // Numbers only while every piece has one: else the bytes say it.
        if self.numbers.is_empty() || other.numbers.is_empty() {
            self.numbers.clear();
            self.fragments = None;
        } else {
            self.numbers.extend(&other.numbers);
            self.numbers.sort_unstable();
            self.numbers.dedup();
        }
        self.bytes.extend(&other.bytes);
        self.bytes
            .sort_by_key(|r| (r.start, r.end.is_none(), r.end));
        let mut merged: Vec<MissingRange> = Vec::with_capacity(self.bytes.len());
        for r in self.bytes.drain(..) {
            match merged.last_mut() {
                Some(last) if last.end.is_none_or(|e| r.start <= e) => {
                    last.end = match (last.end, r.end) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                }
                _ => merged.push(r),
            }
        }
        self.bytes = merged;
    }

    /// In a few words: `IP fragments 2 and 3 of 3 (bytes 1232-3558 of 3558)`, or the bytes
    /// alone where the fragments cannot be numbered.
    pub fn describe(&self) -> String {
        let ranges = self
            .bytes
            .iter()
            .map(|r| match r.end {
                Some(e) => format!("{}-{e}", r.start),
                None => format!("{}-end", r.start),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let of = self
            .total_len
            .map(|t| format!(" of {t}"))
            .unwrap_or_default();
        match (self.fragments, &self.numbers[..]) {
            (Some(count), [n]) => format!("IP fragment {n} of {count} (bytes {ranges}{of})"),
            (Some(count), [rest @ .., last]) if !rest.is_empty() => format!(
                "IP fragments {} and {last} of {count} (bytes {ranges}{of})",
                rest.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            _ => format!("IP fragment bytes {ranges}{of}"),
        }
    }
}

/// The kernel side of a live run: its counters and what could be set up.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KernelStats {
    #[serde(flatten)]
    pub counters: KernelCounters,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub setup: Option<KernelSetup>,
}

/// What the decode stage reports, in the order it happens; the pipeline hands each on to the
/// sinks as a [`Record`](crate::output::record::Record).
#[derive(Clone, Debug)]
pub enum DecodeReport {
    Packet(PacketRecord),
    Drop(DropRecord),
    FragmentLoss(FragmentLossRecord),
}

/// The decode stage's counters: the first part of the `stats` record
/// ([`StatsRecord`](crate::output::record::StatsRecord) flattens them in and adds the
/// correlate stage's and the run's). Field by field in docs/output.md.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DecodeStats {
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
}
