//! The JSON form of the correlate and detect stages' top-level reports (field by field in
//! docs/output.md): their parts (questions, legs, hops, drops, race queries, counters) are
//! their own JSON shape (`#[derive(Serialize)]` where they are defined); a transaction, race
//! or loop is written through a borrowed view of it that adds what is said in words (its
//! summary, path and wall-clock time), made by this stage.
use serde::{Serialize, Serializer};

use super::report;
use crate::{
    correlate::record::{
        LegRecord, LookupRef, Outcome, QuestionRecord, Summary, TransactionRecord,
    },
    decode::{dns::Cut, ip::Addr, record::PodRef},
    detect::{
        loops::{LoopHop, LoopKind, LoopRecord, LoopState},
        race::{CounterDeltas, RaceQuery, RaceRecord, RaceVerdict},
    },
    time::WallTime,
};

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
    outcome: Outcome,
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
            outcome: self.outcome,
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
struct RaceJson<'a> {
    verdict: RaceVerdict,
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
            verdict: self.verdict,
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
    state: LoopState,
    kind: LoopKind,
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
            state: self.state,
            kind: self.kind,
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

    /// The text sink and the agent name the enums with `report`'s words; JSON with their
    /// own `Serialize`: the same words.
    #[test]
    fn enum_names_are_those_of_the_text() {
        use crate::correlate::{
            record::{Join, LegOutcome, NodeCache},
            LegRole,
        };
        fn same<T: Serialize + Copy>(all: &[T], name: fn(T) -> &'static str) {
            for &v in all {
                let json = serde_json::to_value(v).unwrap();
                assert_eq!(json.as_str(), Some(name(v)));
            }
        }
        use LegRole as R;
        same(
            &[R::Query, R::Retry, R::TcpFallback, R::Forward],
            report::role_name,
        );
        same(
            &[Join::SameTuple, Join::Conntrack, Join::Fallback],
            report::join_name,
        );
        use LegOutcome as L;
        same(
            &[
                L::Answered,
                L::Truncated,
                L::Dropped,
                L::Late,
                L::Pending,
                L::Unanswered,
            ],
            report::leg_outcome_name,
        );
        same(
            &[NodeCache::Hit, NodeCache::Miss, NodeCache::Bypass],
            report::node_cache_name,
        );
        use Outcome as O;
        same(
            &[O::Answered, O::Dropped, O::Late, O::Pending, O::Unanswered],
            report::outcome_name,
        );
        use RaceVerdict as V;
        same(
            &[V::RaceDrop, V::ResolvedClash, V::Suspected],
            report::verdict_name,
        );
        same(
            &[LoopState::Detected, LoopState::Ongoing, LoopState::Ended],
            report::loop_state_name,
        );
        same(
            &[LoopKind::Cycle, LoopKind::Amplification],
            report::loop_kind_name,
        );
    }

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
