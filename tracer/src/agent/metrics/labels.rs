//! Label values of the agent's metrics: fixed sets chosen here, and the functions that sort
//! a record's free-form fields into them.
use std::sync::Arc;

use prometheus_client::{
    encoding::{EncodeLabelSet, LabelSetEncoder},
    metrics::{family::Family, histogram::Histogram},
};

use crate::{
    correlate::LegRole,
    decode::dns::{Rcode, RrType},
    detect::loops::LoopKind,
    output::record::LegRecord,
};

/// Latency buckets (seconds): 100 µs … 1 ms resolve hops inside a node (a veth, a DNAT, a
/// node-local cache); 4.5 and 5.5 sit either side of the resolver's 5 s retry (glibc
/// `timeout:5`), so a lookup that waited out one timeout lands above 4.5.
pub const LATENCY_BUCKETS: [f64; 17] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    4.5, 5.5, 10.0,
];

/// Query types with a label of their own; every other type is `other`.
pub const QTYPES: [&str; 13] = [
    "A", "AAAA", "PTR", "SRV", "CNAME", "MX", "TXT", "NS", "SOA", "HTTPS", "SVCB", "ANY", "HINFO",
];

/// Response codes with a label of their own (IANA mnemonics, as `dns.rcode` spells them),
/// by code; every other code is `other`.
pub const RCODES: [(u16, &str); 13] = [
    (0, "NOERROR"),
    (1, "FORMERR"),
    (2, "SERVFAIL"),
    (3, "NXDOMAIN"),
    (4, "NOTIMP"),
    (5, "REFUSED"),
    (6, "YXDOMAIN"),
    (7, "YXRRSET"),
    (8, "NXRRSET"),
    (9, "NOTAUTH"),
    (10, "NOTZONE"),
    (16, "BADVERS"),
    (23, "BADCOOKIE"),
];

/// Distinct kernel drop reasons kept as labels (`enum skb_drop_reason` has ~120 names on
/// 6.18); beyond this, or for a name that is not an enum identifier, `other`.
pub const MAX_DROP_REASONS: usize = 256;

/// A type's label: its mnemonic if it is one of [`QTYPES`], else `other`.
pub fn qtype_label(qtype: RrType) -> &'static str {
    qtype
        .known_name()
        .and_then(|name| QTYPES.iter().find(|t| **t == name))
        .copied()
        .unwrap_or("other")
}

/// A response code's label: its mnemonic if it is one of [`RCODES`], else `other`.
pub fn rcode_label(rcode: &Rcode) -> &'static str {
    RCODES
        .iter()
        .find(|(code, _)| *code == rcode.code())
        .map_or("other", |(_, name)| name)
}

/// Where a leg's query went, from what its record says:
/// - `stub`: a loopback server (127.0.0.0/8, ::1): a node-local or in-pod stub;
/// - `upstream`: a server's own query (a forward: CoreDNS to its upstream);
/// - `service`: a client's query DNAT'd on its way (sent to a Service ClusterIP);
/// - `client`: a client's query delivered where it was sent (a pod IP, a hostNetwork
///   resolver, an external server).
///
/// (A client's query that came from another node is `served`, decided from the whole
/// transaction: [`crate::output::otlp::spans::client_is_local`].)
pub fn leg_label(leg: &LegRecord) -> &'static str {
    if leg.server.ip().is_loopback() {
        "stub"
    } else if leg.role == LegRole::Forward || leg.parent.is_some() {
        "upstream"
    } else if leg.server != leg.backend {
        "service"
    } else {
        "client"
    }
}

/// A malformed packet's free-text reason, sorted into a fixed set.
pub fn malformed_label(reason: &str) -> &'static str {
    if reason.starts_with("IP:") {
        "ip_header"
    } else if reason.starts_with("TCP stream:") {
        "tcp_stream"
    } else if reason.contains("shorter than the 12-byte DNS header") {
        "dns_header"
    } else if reason.starts_with("header counts") {
        "dns_counts"
    } else if ["question #", "answer #", "authority #", "additional #"]
        .iter()
        .any(|s| reason.contains(s))
    {
        "dns_record"
    } else {
        "other"
    }
}

pub(super) fn is_reason_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

pub(super) fn loop_kind_label(kind: LoopKind) -> &'static str {
    kind.as_str()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QueryLabels {
    pub(super) leg: &'static str,
    pub(super) proto: &'static str,
    pub(super) qtype: &'static str,
    #[prometheus(flatten)]
    pub(super) namespace: NamespaceLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResponseLabels {
    pub(super) leg: &'static str,
    pub(super) proto: &'static str,
    pub(super) qtype: &'static str,
    pub(super) rcode: &'static str,
    #[prometheus(flatten)]
    pub(super) namespace: NamespaceLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LegLabels {
    pub(super) leg: &'static str,
    pub(super) proto: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QtypeLabels {
    pub(super) qtype: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TransactionLabels {
    pub(super) qtype: &'static str,
    pub(super) outcome: &'static str,
    #[prometheus(flatten)]
    pub(super) namespace: NamespaceLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SearchLabels {
    pub(super) qtype: &'static str,
    #[prometheus(flatten)]
    pub(super) namespace: NamespaceLabel,
}

/// The `namespace` label of `--namespace-label`: the Kubernetes namespace of the pod that
/// asked (`""` for a client in no known pod, `other` beyond the cap), or no label at all
/// when the flag is off.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub(super) struct NamespaceLabel(pub(super) Option<Arc<str>>);

impl EncodeLabelSet for NamespaceLabel {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        match &self.0 {
            Some(ns) => [("namespace", ns.as_ref())].encode(encoder),
            None => Ok(()),
        }
    }
}

/// The namespace part of a pod's `namespace/name`, if it is a namespace name (an RFC 1123
/// label, as Kubernetes requires): a name read from the host that is not one is `other`.
pub(super) fn pod_namespace(pod: &str) -> &str {
    let Some((ns, _)) = pod.split_once('/') else {
        return "other";
    };
    let label = (1..=63).contains(&ns.len())
        && ns
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !ns.starts_with('-')
        && !ns.ends_with('-');
    if label {
        ns
    } else {
        "other"
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CauseLabels {
    pub(super) cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DropLabels {
    /// Validated and capped: see [`MAX_DROP_REASONS`].
    pub(super) reason: String,
    pub(super) benign: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabels {
    pub(super) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DetectionLabels {
    pub(super) detection: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EventLabels {
    pub(super) event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SinkLabels {
    pub(super) sink: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FindingLabels {
    pub(super) kind: &'static str,
    pub(super) severity: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TableLabels {
    pub(super) table: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BuildLabels {
    pub(super) version: &'static str,
}

pub(super) fn latency_family<S: Clone + std::hash::Hash + Eq>() -> Family<S, Histogram> {
    Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS))
}
