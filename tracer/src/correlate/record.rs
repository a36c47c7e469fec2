//! What the correlate stage reports of a transaction: its legs and their hops (field by field
//! in docs/output.md).
use std::sync::Arc;

use serde::Serialize;

use crate::{
    correlate::LegRole,
    decode::{dns::Cut, record::PodRef},
};

/// One observation of one message of a leg.
#[derive(Clone, Debug, Serialize)]
pub struct HopRecord {
    pub ts_ns: u64,
    pub netns: String,
    pub ifname: String,
    #[serde(flatten)]
    pub pod: PodRef,
    pub dir: &'static str,
    pub src: String,
    pub dst: String,
    pub dns_id: u16,
    pub qr: bool,
    /// For a response: time since the query was seen at this same point.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ns: Option<u64>,
}

/// The kernel drop that ended a leg.
#[derive(Clone, Debug, Serialize)]
pub struct LegDrop {
    pub ts_ns: u64,
    pub netns: String,
    pub ifname: String,
    #[serde(flatten)]
    pub pod: PodRef,
    pub reason: String,
    pub location: String,
    /// The response was dropped (not the query).
    pub response: bool,
}

/// One query and its response between a client socket and a server.
#[derive(Clone, Debug, Serialize)]
pub struct LegRecord {
    pub id: u64,
    /// Index in `legs` of the leg whose server sent this one (forwarding), if any.
    pub parent: Option<usize>,
    pub role: LegRole,
    pub proto: &'static str,
    /// Client and server as seen at the leg's first hop.
    pub client: String,
    pub server: String,
    /// Where the query was delivered (after DNAT; equals `server` without NAT).
    pub backend: String,
    pub dns_id: u16,
    /// How hops were joined: `same-tuple`, `conntrack`, or `fallback` (client port, DNS id,
    /// question).
    pub join: &'static str,
    /// `answered`, `truncated`, `dropped`, `unanswered`.
    pub outcome: &'static str,
    pub rcode: Option<String>,
    pub answers: Vec<String>,
    /// The response was cut by the capture (snaplen) wherever it was seen: how (as the
    /// packet's `dns.cut`); `answers` are those that fit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_cut: Option<Cut>,
    /// Query → response at the leg's first point.
    pub latency_ns: Option<u64>,
    /// The same query re-sent from the same socket with the same id.
    pub retransmits: u32,
    pub drop: Option<LegDrop>,
    pub hops: Vec<HopRecord>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LookupRef {
    pub id: u64,
    /// Index of this transaction's name among the lookup's names (search-list order).
    pub step: u32,
}

/// A question, shared by every leg, index entry and record of it rather than copied into
/// each: cloning it copies a pointer. The correlator's own questions have the name in lower
/// case.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct QuestionRecord(Arc<Question>);

#[derive(Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Question {
    pub name: String,
    #[serde(rename = "type")]
    pub qtype: String,
    pub class: String,
}

impl QuestionRecord {
    pub fn new(name: impl Into<String>, qtype: impl Into<String>, class: impl Into<String>) -> Self {
        Self(Arc::new(Question {
            name: name.into(),
            qtype: qtype.into(),
            class: class.into(),
        }))
    }
}

impl std::ops::Deref for QuestionRecord {
    type Target = Question;
    fn deref(&self) -> &Question {
        &self.0
    }
}

impl std::fmt::Debug for QuestionRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for QuestionRecord {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// One client question followed through every leg it caused.
#[derive(Clone, Debug, Serialize)]
pub struct TransactionRecord {
    pub id: u64,
    pub lookup: LookupRef,
    pub ts_ns: u64,
    pub time: String,
    pub client: String,
    pub client_netns: String,
    /// The client's pod.
    #[serde(flatten)]
    pub pod: PodRef,
    pub question: QuestionRecord,
    /// `answered`, `dropped`, `unanswered`.
    pub outcome: &'static str,
    pub rcode: Option<String>,
    pub answers: Vec<String>,
    /// The answer the client got was cut by the capture: how (see [`LegRecord::answer_cut`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_cut: Option<Cut>,
    /// First query → the answer the client got, at the client's first point.
    pub latency_ns: Option<u64>,
    /// One line for a person, e.g. `timeout after 5.0 s, retried, answered at +5.02 s: NOERROR`.
    pub summary: String,
    /// `--record`: the flight-recorder file holding this incident's packets (written once its
    /// window is over).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    pub legs: Vec<LegRecord>,
}
