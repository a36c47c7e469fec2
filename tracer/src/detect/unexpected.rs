//! Answers from an unexpected source: where a client's query left (its first hop), an answer
//! to it arrived from an address other than the one the query went to there. A connected UDP
//! socket (glibc's and musl's resolvers, dig's) does not take such an answer, so the client
//! waits out its timeout and asks again, or fails.
//!
//! The usual cause in a cluster is an answer that missed its reverse NAT: the query went to a
//! Service's ClusterIP, was DNATed to a DNS pod, and the conntrack entry was gone by the time
//! the answer came back (deleted by kube-proxy on an endpoint change, `conntrack -F`, an
//! expiry while the server took its time), so the answer reaches the client from the pod's
//! own address. A server on several addresses answering from another one (a multihomed
//! host without `IP_PKTINFO`) looks the same, and is the same failure for the client.
//!
//! Only what the hops show at one place is compared: where the address translation happens
//! before the client's first hop is seen (a node-level DNAT of a pod's query, seen on the
//! pod's interface) the answer must come back translated; where it happens after (a local
//! `OUTPUT` DNAT or REDIRECT, seen on the node's interface or `lo`), the query's destination
//! there is already the translated one.
use std::{net::SocketAddr, sync::Arc};

use serde::Serialize;

use super::{Detected, Detection, Detector};
use crate::{
    correlate::{
        detector::Decided,
        record::{HopRecord, LegRecord, Outcome, QuestionRecord, TransactionRecord},
        CorrelateConfig,
    },
    decode::{
        dns::RrType,
        record::{Incident, Names, PodRef, Proto, RecordKind},
    },
    show::{at, escape, wall_clock},
    time::Clock,
};

/// An `unexpected_source` record (field by field in docs/output.md).
#[derive(Clone, Debug, Serialize)]
pub struct UnexpectedSourceRecord {
    /// When the first such answer reached the place.
    pub ts_ns: u64,
    /// `ts_ns` as Unix-epoch nanoseconds, written as `time`.
    #[serde(rename = "time", serialize_with = "crate::time::serialize_wall_ns")]
    pub wall_ns: u64,
    /// The asking socket and its namespace.
    pub client: SocketAddr,
    pub client_netns: Arc<str>,
    /// The client's pod (written flat), where known.
    #[serde(flatten)]
    pub pod: PodRef,
    pub question: QuestionRecord,
    pub dns_id: u16,
    /// Where the query went, as seen at the place.
    pub asked: SocketAddr,
    /// Where the answer came from, as seen at the same place.
    pub answered_from: SocketAddr,
    /// The place: the query's first hop (namespace, interface).
    pub netns: Arc<str>,
    pub ifname: Arc<str>,
    /// The transaction the query belongs to, and what became of it for the client.
    pub transaction: u64,
    pub outcome: Outcome,
    /// `--record`: the flight-recorder file holding its packets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
}

/// It matches by its question and its client's pod; it is a failure, and an incident.
impl RecordKind for UnexpectedSourceRecord {
    fn any_pod(&self, f: &mut dyn FnMut(&PodRef) -> bool) -> bool {
        f(&self.pod)
    }
    fn any_question(&self, f: &mut dyn FnMut(&str, RrType) -> bool) -> bool {
        f(&self.question.name, self.question.qtype)
    }
    fn is_failure(&self) -> bool {
        true
    }
    fn annotate_pods(&mut self, names: &Names) {
        self.pod = names.pod_of(&self.client_netns, "");
    }
    fn incident(&self) -> Option<Incident> {
        Some(Incident {
            kind: "unexpected-source",
            detail: summary(self),
            ts_ns: self.ts_ns,
        })
    }
    fn set_evidence(&mut self, file: Option<String>) {
        self.evidence = file;
    }
}

/// `www.lab.test. A id 4660 asked 10.96.0.10:53, answered from 10.244.1.3:53`.
fn summary(r: &UnexpectedSourceRecord) -> String {
    format!(
        "{} {} id {} asked {}, answered from {}",
        r.question.name, r.question.qtype, r.dns_id, r.asked, r.answered_from
    )
}

impl Detection for UnexpectedSourceRecord {
    fn text(&self) -> String {
        format!(
            "{} ANSWER FROM UNEXPECTED SOURCE: {} [client {} in {}, seen at {}; the client's socket does not take it: {}]",
            wall_clock(self.wall_ns),
            escape(&summary(self)),
            self.client,
            at(&self.client_netns, "", &self.pod),
            at(&self.netns, &self.ifname, &PodRef::default()),
            self.outcome.as_str(),
        )
    }
    fn failure(&self) -> Option<(&'static str, String)> {
        Some(("answer from unexpected source", summary(self)))
    }
}

/// The detector: looks at each decided transaction's UDP legs.
pub(crate) struct UnexpectedSources {
    clock: Clock,
    /// Found in this turn's transactions: they come out after them.
    out: Vec<UnexpectedSourceRecord>,
}

impl UnexpectedSources {
    pub(crate) fn new(clock: Clock, _cfg: &CorrelateConfig) -> Self {
        Self {
            clock,
            out: Vec::new(),
        }
    }

    /// The leg's first answer, at its query's first hop, from elsewhere than the query went.
    fn check(&self, t: &TransactionRecord, leg: &LegRecord) -> Option<UnexpectedSourceRecord> {
        if leg.proto != Proto::Udp {
            return None;
        }
        let query = leg.hops.iter().find(|h| !h.qr)?;
        // A query REDIRECTed to a local proxy goes to a loopback address, and its answer
        // comes back from the address asked (un-NATed on its way out): not this.
        if query.dst.ip().is_loopback() {
            return None;
        }
        let same_place = |h: &&HopRecord| {
            h.qr && h.ifname == query.ifname && h.netns == query.netns && h.dst == query.src
        };
        // From where the query went there, or from what the client asked (the conntrack
        // entry's original destination, where the correlator learnt one).
        let expected = |h: &HopRecord| h.src == query.dst || h.src == leg.server;
        let answer = leg.hops.iter().filter(same_place).find(|h| !expected(h))?;
        // Another answer from where it was expected: the client took that one.
        if leg.hops.iter().filter(same_place).any(expected) {
            return None;
        }
        Some(UnexpectedSourceRecord {
            ts_ns: answer.ts_ns,
            wall_ns: self.clock.epoch_ns(answer.ts_ns),
            client: leg.client,
            client_netns: t.client_netns.clone(),
            pod: PodRef::default(),
            question: t.question.clone(),
            dns_id: leg.dns_id,
            asked: query.dst,
            answered_from: answer.src,
            netns: query.netns.clone(),
            ifname: query.ifname.clone(),
            transaction: t.id,
            outcome: t.outcome,
            evidence: None,
        })
    }
}

impl Detector for UnexpectedSources {
    type Report = Detected;
    type Stats = ();

    /// O(hops) per decided transaction, bounded by the correlator's hops per leg.
    fn decided(&mut self, d: &Decided<'_>) {
        let Some(t) = d.record else {
            return;
        };
        for leg in &t.legs {
            if let Some(r) = self.check(t, leg) {
                self.out.push(r);
            }
        }
    }

    fn settle(&mut self, out: &mut Vec<Detected>) {
        out.extend(self.out.drain(..).map(Detected::from));
    }
}

#[cfg(test)]
#[path = "unexpected_tests.rs"]
mod tests;
