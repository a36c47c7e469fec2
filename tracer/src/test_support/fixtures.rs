//! Records as the pipeline makes them, for the tests of the sinks, the agent and evidence;
//! conntrack's flows and entries, for the stages' tests.
use std::net::SocketAddr;

use crate::{
    correlate::{
        record::{Answered, Join, LegOutcome, Outcome, Summary},
        LegRole,
    },
    detect::{
        loops::{LoopHop, LoopKind, LoopRecord, LoopState, Peer},
        race::{CounterDeltas, RaceNetns, RaceQuery, RaceRecord, RaceVerdict},
    },
    event::{ConntrackEvent, CtChange, CtFlow},
    output::record::{
        DropRecord, LegDrop, LegRecord, LookupRef, PacketRecord, QuestionRecord, Record,
        TransactionRecord,
    },
    time::WallTime,
};

/// The socket address `a` (a fixture's own, well formed).
pub(crate) fn addr(a: &str) -> SocketAddr {
    a.parse().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)))
}

/// A conntrack tuple of IP protocol `proto` from `src` to `dst`.
pub(crate) fn ct_flow(proto: u8, src: &str, dst: &str) -> CtFlow {
    CtFlow {
        src: addr(src),
        dst: addr(dst),
        proto,
    }
}

/// A new conntrack entry in namespace 1, its original and reply tuples each `(src, dst)`;
/// no status bits, zone 0, at time 0.
pub(crate) fn ct_event(proto: u8, orig: (&str, &str), reply: (&str, &str)) -> ConntrackEvent {
    ConntrackEvent {
        ts_ns: 0,
        netns: 1,
        change: CtChange::New,
        status: 0,
        zone: 0,
        orig: ct_flow(proto, orig.0, orig.1),
        reply: ct_flow(proto, reply.0, reply.1),
    }
}

/// 2026-11-30T21:00:00.000000Z as Unix-epoch nanoseconds.
const WALL_NS: u64 = 1_796_072_400_000_000_000;

/// A hop of DNS id 4660 on `eth0` of `netns`; an answer's (`qr`) carries `latency_ns`.
pub(crate) fn hop(
    ts_ns: u64,
    netns: &str,
    dir: crate::event::Direction,
    src: &str,
    dst: &str,
    qr: bool,
    latency_ns: Option<u64>,
) -> crate::output::record::HopRecord {
    crate::output::record::HopRecord {
        ts_ns,
        netns: netns.into(),
        ifname: "eth0".into(),
        pod: Default::default(),
        dir,
        src: addr(src),
        dst: addr(dst),
        dns_id: 4660,
        qr,
        latency_ns: latency_ns.filter(|_| qr),
        tunnel: None,
    }
}

pub(crate) fn question(name: &str, qtype: &str) -> QuestionRecord {
    QuestionRecord::new(name, qtype.into(), crate::decode::dns::RrClass::IN)
}

/// A leg from `client` to `server`, delivered to `backend`, answered with `rcode` in
/// `latency_ns` (`None`: unanswered).
pub(crate) fn leg(
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
            crate::decode::record::Proto::Tcp
        } else {
            crate::decode::record::Proto::Udp
        },
        client: addr(client),
        server: addr(server),
        backend: addr(backend),
        dns_id: 4660,
        join: Join::SameTuple,
        outcome: if rcode.is_some() {
            LegOutcome::Answered
        } else {
            LegOutcome::Unanswered
        },
        rcode: rcode.map(Into::into),
        answers: Vec::new(),
        answer_cut: None,
        latency_ns: rcode.and(latency_ns),
        retransmits: 0,
        drop: None,
        node_cache: None,
        pod_proxy: None,
        hops: Vec::new(),
        race_drop: false,
        closes_loop: None,
        node: None,
    }
}

pub(crate) fn dropped(mut l: LegRecord, reason: &str) -> LegRecord {
    l.outcome = LegOutcome::Dropped;
    l.rcode = None;
    l.latency_ns = None;
    l.drop = Some(LegDrop {
        pod: Default::default(),
        ts_ns: 1,
        netns: "node".into(),
        ifname: "vdnsa".into(),
        reason: reason.to_string(),
        location: "nf_hook_slow+0x9e".to_string(),
        response: false,
        fragments: None,
        fragment_drops_ns: Vec::new(),
    });
    l
}

pub(crate) fn transaction(
    name: &str,
    qtype: &str,
    client: &str,
    rcode: Option<&str>,
    legs: Vec<LegRecord>,
) -> TransactionRecord {
    let (outcome, summary) = match (rcode, legs.iter().find_map(|l| l.drop.as_ref())) {
        (Some(_), _) => (Outcome::Answered, Summary::Answered(Answered::Directly)),
        (None, Some(d)) => (
            Outcome::Dropped,
            Summary::Dropped {
                reason: d.reason.clone(),
                location: d.location.clone(),
                retried: false,
                at_client: false,
                part: None,
            },
        ),
        (None, None) => (
            Outcome::Unanswered,
            Summary::Unanswered {
                timeout_ns: 5_000_000_000,
                retries: None,
            },
        ),
    };
    TransactionRecord {
        evidence: None,
        pod: Default::default(),
        id: 1,
        lookup: LookupRef { id: 1, step: 0 },
        ts_ns: 1_000,
        wall_ns: WALL_NS,
        client: addr(client),
        client_netns: "client".into(),
        question: question(name, qtype),
        outcome,
        rcode: rcode.map(Into::into),
        answers: Vec::new(),
        answer_cut: None,
        latency_ns: rcode.map(|_| 630_000),
        summary,
        legs,
        nodes: Vec::new(),
    }
}

/// A client's query through the Service 10.96.0.10 to a CoreDNS pod, and that pod's query
/// to its upstream.
pub(crate) fn service_transaction(
    name: &str,
    qtype: &str,
    client_port: u16,
    rcode: &str,
) -> Record {
    let client = format!("10.244.1.2:{client_port}");
    Record::Transaction(Box::new(transaction(
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
    )))
}

pub(crate) fn race(verdict: RaceVerdict, client: &str, dns_id: u16, qtype: &str) -> RaceRecord {
    RaceRecord {
        evidence: None,
        pod: Default::default(),
        verdict,
        ts_ns: 2_000,
        wall_ns: WALL_NS,
        netns: RaceNetns::Name("node".to_string()),
        client: Some(addr(client)),
        client_netns: "client".to_string(),
        dropped: Some(RaceQuery {
            dns_id,
            question: question("api.lab.test.", qtype),
            backend: addr("10.244.1.3:53"),
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
        drop_offset_ns: Some(600_000),
    }
}

pub(crate) fn loop_record(id: u64, state: LoopState, ts_ns: u64) -> LoopRecord {
    LoopRecord {
        evidence: None,
        id,
        state,
        kind: LoopKind::Cycle,
        ts_ns,
        wall_ns: WALL_NS,
        question: question("storm.lab.test.", "A"),
        loop_plugin_probe: false,
        cycle: vec![LoopHop {
            from: Peer::Socket(addr("10.244.1.3:40000")),
            server: Some(addr("10.96.0.10:53")),
            backend: Peer::Socket(addr("10.244.1.4:53")),
            at: Some(("node".to_string(), "vdnsb".to_string())),
            pod: Default::default(),
        }],
        hop_count: 2,
        rate_pps: 200_000,
        packets: 10,
        summarised: 5,
        clients: vec![addr("10.244.1.2:5000")],
        first_seen_ns: ts_ns,
        detected_ns: ts_ns,
        last_seen_ns: ts_ns,
    }
}

pub(crate) fn drop_record(reason: &str, benign: Option<&'static str>) -> DropRecord {
    DropRecord {
        evidence: None,
        pod: None,
        ts_ns: 3_000,
        time: WallTime(WALL_NS),
        cpu: 1,
        netns: "node".into(),
        netns_cookie: 4096,
        ifname: "vdnsa".into(),
        ifindex: 7,
        reason: reason.to_string(),
        reason_code: Some(12),
        confirm_failed: None,
        location: "nft_do_chain+0x3f".to_string(),
        proto: crate::decode::record::Proto::Udp,
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

pub(crate) fn malformed_packet(reason: &str) -> PacketRecord {
    PacketRecord {
        pod: None,
        ts_ns: 4_000,
        time: WallTime(WALL_NS),
        cpu: Some(0),
        netns: "node".into(),
        netns_cookie: 4096,
        ifname: "vdnsa".into(),
        ifindex: 7,
        dir: crate::event::Direction::Egress,
        proto: crate::decode::record::Proto::Udp,
        src: addr("10.244.1.2:5353").into(),
        dst: addr("10.244.1.3:53").into(),
        len: 40,
        caplen: 40,
        vlan: None,
        tunnel: None,
        dns: None,
        malformed: Some(reason.to_string()),
        capture_truncated: false,
    }
}
