//! docs/output.md documents every JSON field: this test serialises each record type with
//! its optional parts filled in and fails on a key the document does not name, so the
//! reference cannot drift from the code.
use std::collections::BTreeSet;

use serde_json::Value;

use crate::{
    agent::fixtures,
    correlate::CorrelateStats,
    decode::dns,
    detect::{loops::LoopState, race::RaceVerdict},
    event::{KernelCounters, KernelSetup},
    output::record::{CtEndpoints, CtRecord, DecodeStats, KernelStats, Record, StatsRecord},
};

const DOC: &str = include_str!("../../../docs/output.md");

/// `key` is named in the document: as `` `key` ``, or inside a `{a, b, …}` listing.
fn documented(key: &str) -> bool {
    if DOC.contains(&format!("`{key}`")) {
        return true;
    }
    DOC.lines().filter(|l| l.contains('{')).any(|l| {
        l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|w| w == key)
    })
}

fn keys(v: &Value, path: &str, out: &mut BTreeSet<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                out.insert((k.clone(), format!("{path}.{k}")));
                keys(v, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(a) => {
            for v in a {
                keys(v, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// A response with an answer, EDNS with an option, and a cut copy of it.
fn messages() -> (dns::DnsMessage, dns::DnsMessage) {
    use hickory_proto::{
        op::{Edns, Message, MessageType, OpCode, Query},
        rr::{
            rdata::opt::{ClientSubnet, EdnsOption},
            rdata::A,
            Name, RData, Record as HRecord, RecordType,
        },
    };
    let name = Name::from_ascii("www.lab.test.").unwrap();
    let mut m = Message::new(7, MessageType::Response, OpCode::Query);
    m.add_query(Query::query(name.clone(), RecordType::A));
    for i in 0..4 {
        m.add_answer(HRecord::from_rdata(
            name.clone(),
            30,
            RData::A(A::new(10, 0, 0, i)),
        ));
    }
    let mut edns = Edns::new();
    edns.options_mut()
        .insert(EdnsOption::Subnet(ClientSubnet::new(
            std::net::IpAddr::from([10, 244, 1, 0]),
            24,
            0,
        )));
    m.set_edns(edns);
    let bytes = m.to_vec().unwrap();
    let whole = dns::decode(&bytes).unwrap();
    let cut = dns::decode_cut(&bytes[..60], bytes.len()).unwrap().unwrap();
    (whole, cut)
}

fn records() -> Vec<Record> {
    let (whole, cut) = messages();
    let mut packet = fixtures::malformed_packet("x");
    packet.vlan = Some(10);
    packet.capture_truncated = true;
    packet.dns = Some(cut.into());
    let tunnel = std::sync::Arc::new(crate::decode::tunnel::Tunnel {
        kind: crate::decode::tunnel::TunnelKind::Vxlan,
        id: Some(1),
        src: [10, 200, 0, 1].into(),
        dst: [10, 200, 0, 2].into(),
    });
    packet.tunnel = Some(tunnel.clone());
    let mut drop = fixtures::drop_record("NETFILTER_DROP", Some("normal socket life"));
    drop.confirm_failed = Some(true);
    drop.capture_truncated = true;
    drop.fragment = Some(crate::output::record::DroppedFragment {
        ip_id: 0x1a2b,
        offset: 1232,
        len: 1232,
    });
    drop.malformed = Some("x".into());
    drop.dns = Some(whole.into());
    drop.ct = Some(CtRecord {
        status: 0x1a0,
        status_flags: vec!["DST_NAT"],
        confirmed: false,
        orig: CtEndpoints {
            src: "a".into(),
            dst: "b".into(),
        },
        reply: CtEndpoints {
            src: "b".into(),
            dst: "a".into(),
        },
    });
    drop.evidence = Some("DIR/dnspath-x-drop.pcapng".into());
    // A leg with a hop seen inside a tunnel (and its GRE sibling's `key`).
    let mut leg = fixtures::leg(
        crate::correlate::LegRole::Query,
        "10.244.1.2:1",
        "10.96.0.10:53",
        "10.244.2.3:53",
        None,
        None,
    );
    let hop = crate::correlate::record::HopRecord {
        ts_ns: 1,
        netns: "node".into(),
        ifname: "eth0".into(),
        pod: Default::default(),
        dir: crate::event::Direction::Egress,
        src: fixtures::addr("10.244.1.2:1"),
        dst: fixtures::addr("10.244.2.3:53"),
        dns_id: 1,
        qr: false,
        latency_ns: Some(1),
        tunnel: Some(tunnel.clone()),
    };
    let gre = crate::decode::tunnel::Tunnel {
        kind: crate::decode::tunnel::TunnelKind::Gre,
        id: Some(7),
        ..*tunnel
    };
    leg.hops = vec![
        hop.clone(),
        crate::correlate::record::HopRecord {
            tunnel: Some(std::sync::Arc::new(gre)),
            ..hop
        },
    ];
    let mut transaction =
        fixtures::transaction("www.lab.test.", "A", "10.244.1.2:1", None, vec![leg]);
    transaction.evidence = Some("DIR/dnspath-x-unanswered.pcapng".into());
    let mut lp = fixtures::loop_record(1, LoopState::Detected, 1);
    lp.evidence = Some("DIR/dnspath-x-loop.pcapng".into());
    let mut race = fixtures::race(RaceVerdict::RaceDrop, "10.244.1.2:1", 1, "A");
    race.evidence = Some("DIR/dnspath-x-race-drop.pcapng".into());
    let stats = StatsRecord {
        evidence: Some(crate::output::annotate::EvidenceStats {
            annotate: Default::default(),
            write: Some(crate::output::files::WriteStats {
                failed: Some("x".into()),
                ..Default::default()
            }),
            record: Some(crate::output::recorder::RecordStats {
                failed: Some("x".into()),
                ..Default::default()
            }),
        }),
        decode: DecodeStats {
            kernel: Some(KernelStats {
                counters: KernelCounters::default(),
                setup: Some(KernelSetup {
                    release: "6.1".into(),
                    tc_attach: "clsact",
                    hooks: vec!["tc"],
                    drop_reason: true,
                    netns_id: "cookie",
                    degraded: vec![],
                    attach_failures: 0,
                }),
            }),
            ..DecodeStats::default()
        },
        correlate: Some(CorrelateStats::default()),
        stopped_by: Some("SIGINT".into()),
        sinks: vec![crate::output::queue::SinkStats {
            name: "output",
            written: 1,
            dropped: 1,
        }],
        otlp: Some(Default::default()),
        ..StatsRecord::default()
    };
    vec![
        Record::Packet(packet),
        Record::Drop(Box::new(drop)),
        fixtures::service_transaction("www.lab.test.", "A", 40000, "NOERROR"),
        Record::Transaction(Box::new(transaction)),
        Record::Loop(lp),
        Record::Race(Box::new(race)),
        Record::Stats(Box::new(stats)),
    ]
}

#[test]
fn every_json_field_is_documented() {
    let mut all = BTreeSet::new();
    for r in records() {
        let v = serde_json::to_value(&r).unwrap();
        let t = v["type"].as_str().unwrap_or("?").to_string();
        keys(&v, &t, &mut all);
    }
    let missing: Vec<String> = all
        .iter()
        .filter(|(k, _)| !documented(k))
        .map(|(_, path)| path.clone())
        .collect();
    assert!(
        missing.is_empty(),
        "fields missing from docs/output.md: {missing:#?}"
    );
    // The test sees the fields it is about.
    assert!(all.iter().any(|(k, _)| k == "capture_truncated"));
    assert!(all.iter().any(|(_, p)| p.starts_with("stats.correlate.")));
    assert!(all
        .iter()
        .any(|(_, p)| p == "stats.evidence.record.not_written"));
    assert!(all.iter().any(|(_, p)| p == "race.evidence"));
    assert!(all.iter().any(|(_, p)| p == "packet.tunnel.vni"));
    assert!(all
        .iter()
        .any(|(_, p)| p == "transaction.legs[].hops[].tunnel.key"));
}
