//! The JSON form of the correlate and detect stages' reports (field by field in
//! docs/output.md): each report is written through a borrowed view of it in record shape,
//! with its names, wall-clock time, summary and path in words.
use serde::{Serialize, Serializer};

use super::report;
use crate::{
    correlate::record::{
        HopRecord, LegDrop, LegRecord, LookupRef, QuestionRecord, Summary, TransactionRecord,
    },
    decode::{dns::Cut, ip::Addr, record::PodRef},
    detect::{
        loops::{LoopHop, LoopRecord},
        race::{CounterDeltas, RaceQuery, RaceRecord},
    },
    event::Direction,
    time::WallTime,
};

#[derive(Serialize)]
struct QuestionJson<'a> {
    name: &'a str,
    #[serde(rename = "type")]
    qtype: &'a str,
    class: &'a str,
}

impl Serialize for QuestionRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        QuestionJson {
            name: &self.name,
            qtype: &self.qtype,
            class: &self.class,
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct LookupJson {
    id: u64,
    step: u32,
}

impl Serialize for LookupRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        LookupJson {
            id: self.id,
            step: self.step,
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct HopJson<'a> {
    ts_ns: u64,
    netns: &'a str,
    ifname: &'a str,
    #[serde(flatten)]
    pod: &'a PodRef,
    dir: Direction,
    src: Addr,
    dst: Addr,
    dns_id: u16,
    qr: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tunnel: Option<&'a crate::decode::tunnel::Tunnel>,
}

impl Serialize for HopRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        HopJson {
            ts_ns: self.ts_ns,
            netns: &self.netns,
            ifname: &self.ifname,
            pod: &self.pod,
            dir: self.dir,
            src: Addr(self.src),
            dst: Addr(self.dst),
            dns_id: self.dns_id,
            qr: self.qr,
            latency_ns: self.latency_ns,
            tunnel: self.tunnel.as_deref(),
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct LegDropJson<'a> {
    ts_ns: u64,
    netns: &'a str,
    ifname: &'a str,
    #[serde(flatten)]
    pod: &'a PodRef,
    reason: &'a str,
    location: &'a str,
    response: bool,
}

impl Serialize for LegDrop {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        LegDropJson {
            ts_ns: self.ts_ns,
            netns: &self.netns,
            ifname: &self.ifname,
            pod: &self.pod,
            reason: &self.reason,
            location: &self.location,
            response: self.response,
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct LegJson<'a> {
    id: u64,
    parent: Option<usize>,
    role: &'static str,
    proto: &'static str,
    client: Addr,
    server: Addr,
    backend: Addr,
    dns_id: u16,
    join: &'static str,
    outcome: &'static str,
    rcode: Option<&'a str>,
    answers: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    answer_cut: Option<&'a Cut>,
    latency_ns: Option<u64>,
    retransmits: u32,
    drop: Option<&'a LegDrop>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_cache: Option<&'static str>,
    hops: &'a [HopRecord],
}

impl Serialize for LegRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        LegJson {
            id: self.id,
            parent: self.parent,
            role: report::role_name(self.role),
            proto: report::proto_name(self.proto),
            client: Addr(self.client),
            server: Addr(self.server),
            backend: Addr(self.backend),
            dns_id: self.dns_id,
            join: report::join_name(self.join),
            outcome: report::leg_outcome_name(self.outcome),
            rcode: self.rcode.as_deref(),
            answers: &self.answers,
            answer_cut: self.answer_cut.as_ref(),
            latency_ns: self.latency_ns,
            retransmits: self.retransmits,
            drop: self.drop.as_ref(),
            node_cache: self.node_cache.map(report::node_cache_name),
            hops: &self.hops,
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct TransactionJson<'a> {
    id: u64,
    lookup: &'a LookupRef,
    ts_ns: u64,
    time: WallTime,
    client: Addr,
    client_netns: &'a str,
    #[serde(flatten)]
    pod: &'a PodRef,
    question: &'a QuestionRecord,
    outcome: &'static str,
    rcode: Option<&'a str>,
    answers: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    answer_cut: Option<&'a Cut>,
    latency_ns: Option<u64>,
    /// `late`: when the answer came (first query → the client's namespace), and the
    /// client's own timeout where its retry shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    late_answer_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_timeout_ns: Option<u64>,
    summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    evidence: Option<&'a str>,
    legs: &'a [LegRecord],
}

impl Serialize for TransactionRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        TransactionJson {
            id: self.id,
            lookup: &self.lookup,
            ts_ns: self.ts_ns,
            time: WallTime(self.wall_ns),
            client: Addr(self.client),
            client_netns: &self.client_netns,
            pod: &self.pod,
            question: &self.question,
            outcome: report::outcome_name(self.outcome),
            rcode: self.rcode.as_deref(),
            answers: &self.answers,
            answer_cut: self.answer_cut.as_ref(),
            latency_ns: self.latency_ns,
            late_answer_ns: match &self.summary {
                Summary::Late { answer_ns, .. } => Some(*answer_ns),
                _ => None,
            },
            client_timeout_ns: match &self.summary {
                Summary::Late { gave_up_ns, .. } => *gave_up_ns,
                _ => None,
            },
            summary: report::transaction_summary(self),
            evidence: self.evidence.as_deref(),
            legs: &self.legs,
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct CountersJson {
    insert_failed: u64,
    drop: u64,
    clash_resolve: u64,
}

impl Serialize for CounterDeltas {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        CountersJson {
            insert_failed: self.insert_failed,
            drop: self.drop,
            clash_resolve: self.clash_resolve,
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct RaceQueryJson<'a> {
    dns_id: u16,
    question: &'a QuestionRecord,
    backend: Addr,
    offset_ns: u64,
}

impl Serialize for RaceQuery {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RaceQueryJson {
            dns_id: self.dns_id,
            question: &self.question,
            backend: Addr(self.backend),
            offset_ns: self.offset_ns,
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct RaceJson<'a> {
    verdict: &'static str,
    ts_ns: u64,
    time: WallTime,
    netns: String,
    client: String,
    client_netns: &'a str,
    #[serde(flatten)]
    pod: &'a PodRef,
    dropped: Option<&'a RaceQuery>,
    sibling: Option<&'a RaceQuery>,
    cpu: Option<u32>,
    counters: &'a CounterDeltas,
    counter_confirmed: bool,
    kernel_confirm_failed: Option<bool>,
    drop_reason: Option<&'a str>,
    drop_location: Option<&'a str>,
    retry_ns: Option<u64>,
    total_delay_ns: Option<u64>,
    summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    evidence: Option<&'a str>,
}

impl Serialize for RaceRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RaceJson {
            verdict: report::verdict_name(self.verdict),
            ts_ns: self.ts_ns,
            time: WallTime(self.wall_ns),
            netns: report::race_netns(&self.netns),
            client: self.client.map(|c| c.to_string()).unwrap_or_default(),
            client_netns: &self.client_netns,
            pod: &self.pod,
            dropped: self.dropped.as_ref(),
            sibling: self.sibling.as_ref(),
            cpu: self.cpu,
            counters: &self.counters,
            counter_confirmed: self.counter_confirmed,
            kernel_confirm_failed: self.kernel_confirm_failed,
            drop_reason: self.drop_reason.as_deref(),
            drop_location: self.drop_location.as_deref(),
            retry_ns: self.retry_ns,
            total_delay_ns: self.total_delay_ns,
            summary: report::race_summary(self),
            evidence: self.evidence.as_deref(),
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct LoopHopJson<'a> {
    from: String,
    server: String,
    backend: String,
    at: String,
    #[serde(flatten)]
    pod: &'a PodRef,
}

impl Serialize for LoopHop {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        LoopHopJson {
            from: report::peer(&self.from),
            server: report::loop_server(self),
            backend: report::peer(&self.backend),
            at: report::loop_at(self),
            pod: &self.pod,
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct LoopJson<'a> {
    id: u64,
    state: &'static str,
    kind: &'static str,
    ts_ns: u64,
    time: WallTime,
    question: &'a QuestionRecord,
    zone: &'a str,
    loop_plugin_probe: bool,
    cycle: &'a [LoopHop],
    path: String,
    hop_count: u64,
    rate_pps: u64,
    packets: u64,
    summarised: u64,
    clients: Vec<String>,
    first_seen_ns: u64,
    detected_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    evidence: Option<&'a str>,
    last_seen_ns: u64,
}

impl Serialize for LoopRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        LoopJson {
            id: self.id,
            state: report::loop_state_name(self.state),
            kind: report::loop_kind_name(self.kind),
            ts_ns: self.ts_ns,
            time: WallTime(self.wall_ns),
            question: &self.question,
            zone: report::zone(&self.question.name),
            loop_plugin_probe: self.loop_plugin_probe,
            cycle: &self.cycle,
            path: report::loop_path(self),
            hop_count: self.hop_count,
            rate_pps: self.rate_pps,
            packets: self.packets,
            summarised: self.summarised,
            clients: report::loop_clients(self),
            first_seen_ns: self.first_seen_ns,
            detected_ns: self.detected_ns,
            evidence: self.evidence.as_deref(),
            last_seen_ns: self.last_seen_ns,
        }
        .serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for a in [
            "0.0.0.0:0",
            "10.244.1.2:53",
            "255.255.255.255:65535",
            "1.22.133.4:1000",
            "[::1]:53",
            "[fd00::a:1]:5353",
        ] {
            let addr: SocketAddr = a.parse().unwrap();
            let json = serde_json::to_string(&Addr(addr)).unwrap();
            assert_eq!(json, format!("\"{addr}\""));
        }
    }
}
