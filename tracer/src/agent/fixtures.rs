//! Records as the pipeline makes them, for the agent's tests.
use crate::{
    correlate::{
        loops::{LoopKind, LoopRecord, LoopState},
        race::{CounterDeltas, RaceQuery, RaceRecord, RaceVerdict},
        LegRole,
    },
    output::record::{
        DropRecord, LegDrop, LegRecord, LookupRef, PacketRecord, QuestionRecord, Record,
        TransactionRecord,
    },
};

pub fn question(name: &str, qtype: &str) -> QuestionRecord {
    QuestionRecord::new(name, qtype, "IN")
}

/// A leg from `client` to `server`, delivered to `backend`, answered with `rcode` in
/// `latency_ns` (`None`: unanswered).
pub fn leg(
    role: LegRole,
    client: &str,
    server: &str,
    backend: &str,
    rcode: Option<&str>,
    latency_ns: Option<u64>,
) -> LegRecord {
    LegRecord {
        id: 1,
        parent: if role == LegRole::Forward {
            Some(0)
        } else {
            None
        },
        role,
        proto: if role == LegRole::TcpFallback {
            "tcp"
        } else {
            "udp"
        },
        client: client.to_string(),
        server: server.to_string(),
        backend: backend.to_string(),
        dns_id: 4660,
        join: "same-tuple",
        outcome: if rcode.is_some() {
            "answered"
        } else {
            "unanswered"
        },
        rcode: rcode.map(str::to_string),
        answers: Vec::new(),
        answer_cut: None,
        latency_ns: rcode.and(latency_ns),
        retransmits: 0,
        drop: None,
        hops: Vec::new(),
    }
}

pub fn dropped(mut l: LegRecord, reason: &str) -> LegRecord {
    l.outcome = "dropped";
    l.rcode = None;
    l.latency_ns = None;
    l.drop = Some(LegDrop {
        pod: Default::default(),
        ts_ns: 1,
        netns: "node".to_string(),
        ifname: "vdnsa".to_string(),
        reason: reason.to_string(),
        location: "nf_hook_slow+0x9e".to_string(),
        response: false,
    });
    l
}

pub fn transaction(
    name: &str,
    qtype: &str,
    client: &str,
    rcode: Option<&str>,
    legs: Vec<LegRecord>,
) -> TransactionRecord {
    let outcome = match (rcode, legs.iter().any(|l| l.drop.is_some())) {
        (Some(_), _) => "answered",
        (None, true) => "dropped",
        (None, false) => "unanswered",
    };
    TransactionRecord {
        evidence: None,
        pod: Default::default(),
        id: 1,
        lookup: LookupRef { id: 1, step: 0 },
        ts_ns: 1_000,
        time: "2026-11-30T21:00:00.000000Z".to_string(),
        client: client.to_string(),
        client_netns: "client".to_string(),
        question: question(name, qtype),
        outcome,
        rcode: rcode.map(str::to_string),
        answers: Vec::new(),
        answer_cut: None,
        latency_ns: rcode.map(|_| 630_000),
        summary: String::new(),
        legs,
    }
}

/// A client's query through the Service 10.96.0.10 to a CoreDNS pod, and that pod's query
/// to its upstream.
pub fn service_transaction(name: &str, qtype: &str, client_port: u16, rcode: &str) -> Record {
    let client = format!("10.244.1.2:{client_port}");
    Record::Transaction(transaction(
        name,
        qtype,
        &client,
        Some(rcode),
        vec![
            leg(
                LegRole::Query,
                &client,
                "10.96.0.10:53",
                "10.244.1.3:53",
                Some(rcode),
                Some(630_000),
            ),
            leg(
                LegRole::Forward,
                "10.244.1.3:40000",
                "10.250.0.53:53",
                "10.250.0.53:53",
                Some(rcode),
                Some(273_000),
            ),
        ],
    ))
}

pub fn race(verdict: RaceVerdict, client: &str, dns_id: u16, qtype: &str) -> RaceRecord {
    RaceRecord {
        evidence: None,
        pod: Default::default(),
        verdict,
        ts_ns: 2_000,
        time: "2026-11-30T21:00:00.000000Z".to_string(),
        netns: "node".to_string(),
        client: client.to_string(),
        client_netns: "client".to_string(),
        dropped: Some(RaceQuery {
            dns_id,
            question: question("api.lab.test.", qtype),
            backend: "10.244.1.3:53".to_string(),
            offset_ns: 600_000,
        }),
        sibling: None,
        cpu: Some(1),
        counters: CounterDeltas {
            insert_failed: 1,
            drop: 1,
            clash_resolve: 0,
        },
        counter_confirmed: true,
        kernel_confirm_failed: None,
        drop_reason: Some("NETFILTER_DROP".to_string()),
        drop_location: Some("nf_hook_slow+0x9e".to_string()),
        retry_ns: Some(5_000_000_000),
        total_delay_ns: Some(5_001_000_000),
        summary: "lookup of api.lab.test. took 5.00 s: A dropped by conntrack race".to_string(),
    }
}

pub fn loop_record(id: u64, state: LoopState, ts_ns: u64) -> LoopRecord {
    LoopRecord {
        evidence: None,
        id,
        state,
        kind: LoopKind::Cycle,
        ts_ns,
        time: "2026-11-30T21:00:00.000000Z".to_string(),
        question: question("storm.lab.test.", "A"),
        zone: "lab.test.".to_string(),
        loop_plugin_probe: false,
        cycle: Vec::new(),
        path: "10.244.1.3:40000 → 10.96.0.10:53 ⇒DNAT 10.244.1.4:53".to_string(),
        hop_count: 2,
        rate_pps: 200_000,
        packets: 10,
        summarised: 5,
        clients: vec!["10.244.1.2:5000".to_string()],
        first_seen_ns: ts_ns,
        detected_ns: ts_ns,
        last_seen_ns: ts_ns,
    }
}

pub fn drop_record(reason: &str, benign: Option<&'static str>) -> DropRecord {
    DropRecord {
        evidence: None,
        pod: Default::default(),
        ts_ns: 3_000,
        time: "2026-11-30T21:00:00.000000Z".to_string(),
        cpu: 1,
        netns: "node".to_string(),
        netns_cookie: 4096,
        ifname: "vdnsa".to_string(),
        ifindex: 7,
        reason: reason.to_string(),
        reason_code: Some(12),
        confirm_failed: None,
        location: "nft_do_chain+0x3f".to_string(),
        proto: "udp",
        src: "10.244.1.2:5353".to_string(),
        dst: "10.244.1.3:53".to_string(),
        len: 77,
        ct: None,
        dns: None,
        malformed: None,
        capture_truncated: false,
        fragment: None,
        benign,
    }
}

pub fn malformed_packet(reason: &str) -> PacketRecord {
    PacketRecord {
        pod: Default::default(),
        ts_ns: 4_000,
        time: "2026-11-30T21:00:00.000000Z".to_string(),
        cpu: Some(0),
        netns: "node".to_string(),
        netns_cookie: 4096,
        ifname: "vdnsa".to_string(),
        ifindex: 7,
        dir: "egress",
        proto: "udp",
        src: "10.244.1.2:5353".to_string(),
        dst: "10.244.1.3:53".to_string(),
        len: 40,
        caplen: 40,
        vlan: None,
        dns: None,
        malformed: Some(reason.to_string()),
        capture_truncated: false,
    }
}
