//! docs/output.md documents every JSON field, and documents no field that is not written:
//! these tests serialise each record type with its optional parts filled in and fail on a
//! key the document does not name, and on a key its tables list that no record has, so the
//! reference cannot drift from the code either way.
use std::collections::BTreeSet;

use serde_json::Value;

use crate::{
    correlate::CorrelateStats,
    decode::dns,
    event::{KernelCounters, KernelSetup},
    output::record::{
        CtEndpoints, CtRecord, DecodeStats, Detected, KernelStats, Record, StatsRecord,
    },
    test_support::fixtures,
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

/// The keys the document's field tables list (the first column's `` `key` ``s; of a dotted
/// `tunnel.kind`, `kind`), in the sections about JSON records: not those about the text
/// form, the filters, the pcapng comments (`## Evidence`) or capture files (`## Offline`).
fn table_keys() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut records = false;
    for line in DOC.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            records = !["Text", "Filters", "Evidence", "Offline"]
                .iter()
                .any(|s| h.starts_with(s));
            continue;
        }
        if !records || !line.starts_with("| `") {
            continue;
        }
        let first = line.split('|').nth(1).unwrap_or("");
        for key in first.split('`').skip(1).step_by(2) {
            out.insert(key.rsplit('.').next().unwrap_or(key).to_string());
        }
    }
    out
}

/// Keys the NDJSON sink splices into lines after serialising a record (output/otlp): a
/// transaction's `trace_id` (seen here through [`super::otlp::Identity::extend_json`]) and, with
/// `--node-name`, every record's `node` (the run's identity is set once per process, so
/// not here).
const SPLICED: [&str; 1] = ["node"];

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
        number: Some(2),
        fragments: Some(3),
        total_len: Some(3558),
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
    // Served by the node cache; its answer cut by the capture.
    leg.node_cache = Some(crate::correlate::record::NodeCache::Hit);
    // (Not both at once in a trace: a field each.)
    leg.pod_proxy = Some(crate::correlate::record::PodProxy::Hit);
    leg.answer_cut = Some(dns::Cut::default());
    // From `analyze` of several nodes' captures.
    leg.node = Some("node-a".into());
    // Its answer's later IP fragments dropped.
    leg.drop = fixtures::dropped(leg.clone(), "NETFILTER_DROP")
        .drop
        .map(|mut d| {
            d.fragments = Some(crate::decode::record::DroppedPart {
                ip_id: 0x1a2b,
                fragments: Some(3),
                numbers: vec![2, 3],
                bytes: vec![crate::decode::record::MissingRange {
                    start: 1232,
                    end: Some(3558),
                }],
                total_len: Some(3558),
            });
            d
        });
    let mut transaction =
        fixtures::transaction("www.lab.test.", "A", "10.244.1.2:1", None, vec![leg]);
    transaction.evidence = Some("DIR/dnspath-x-unanswered.pcapng".into());
    transaction.nodes = vec!["node-a".into()];
    // A late answer (its times), cut by the capture, to a pod known in full.
    transaction.summary = crate::correlate::record::Summary::Late {
        answer_ns: 2,
        gave_up_ns: Some(1),
        reason: "NO_SOCKET".into(),
        location: "x".into(),
        retried: false,
    };
    transaction.answer_cut = Some(dns::Cut::default());
    transaction.pod = crate::decode::record::PodRef {
        pod: Some("ns/client".into()),
        pod_uid: Some("uid".into()),
        container: Some("c".into()),
        container_id: Some("containerd://x".into()),
        pod_veth: true,
    };
    let stats = StatsRecord {
        evidence: Some(crate::output::evidence::EvidenceStats {
            annotate: Default::default(),
            write: Some(crate::output::evidence::WriteStats {
                failed: Some("x".into()),
                ..Default::default()
            }),
            record: Some(crate::output::evidence::RecordStats {
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
        conntrack: Some(Default::default()),
        learnt_ports: Some(Default::default()),
        drops_reserve: Some(0),
        ..StatsRecord::default()
    };
    let (whole_again, _) = messages();
    let loss = crate::decode::record::FragmentLossRecord {
        ts_ns: 2,
        time: crate::time::WallTime(2),
        first_ts_ns: 1,
        netns: "node".into(),
        netns_cookie: 1,
        ifname: "eth0".into(),
        ifindex: 2,
        pod: None,
        dir: crate::event::Direction::Ingress,
        proto: "udp".into(),
        src: "10.244.1.3".into(),
        dst: "10.244.1.2".into(),
        ip_id: 7,
        cause: "timeout",
        fragments_seen: vec![crate::decode::record::FragmentRange {
            offset: 0,
            len: 1232,
        }],
        missing: vec![crate::decode::record::MissingRange {
            start: 1232,
            end: None,
        }],
        total_len: None,
        fragments: Some(2),
        missing_fragments: Some(vec![2]),
        dns: Some(whole_again),
        summary: "x".into(),
    };
    let mut all = vec![
        Record::Packet(packet),
        Record::FragmentLoss(Box::new(loss)),
        Record::Drop(Box::new(drop)),
        fixtures::service_transaction("www.lab.test.", "A", 40000, "NOERROR"),
        Record::Transaction(Box::new(transaction)),
        Record::Summary(Box::new(summary())),
        Record::Stats(Box::new(stats)),
    ];
    all.extend(Detected::samples().into_iter().map(Record::Detected));
    all
}

/// A summary with every list filled, a server's pod among them.
fn summary() -> crate::output::summary::SummaryRecord {
    let mut tally = crate::output::summarize::RunTally::default();
    tally.add(&fixtures::service_transaction(
        "www.lab.test.",
        "A",
        1,
        "SERVFAIL",
    ));
    let mut s = tally.record();
    s.busiest_servers[0].pod = Some("kube-system/coredns-a".into());
    s
}

/// Every key of every record, with its path (`transaction.legs[].hops[].tunnel.key`), as
/// the NDJSON sink writes them.
fn written() -> BTreeSet<(String, String)> {
    let mut all = BTreeSet::new();
    for r in records() {
        let mut line = serde_json::to_vec(&r).unwrap();
        super::otlp::Identity::default().extend_json(&r, &mut line);
        let v: Value = serde_json::from_slice(&line).unwrap();
        let t = v["type"].as_str().unwrap_or("?").to_string();
        keys(&v, &t, &mut all);
    }
    all
}

#[test]
fn every_documented_field_is_written() {
    let written: BTreeSet<String> = written().into_iter().map(|(k, _)| k).collect();
    let table = table_keys();
    let unwritten: Vec<&String> = table
        .iter()
        .filter(|k| !written.contains(*k) && !SPLICED.contains(&k.as_str()))
        .collect();
    assert!(
        unwritten.is_empty(),
        "docs/output.md lists fields no record has: {unwritten:#?}"
    );
    // The test sees the tables it is about.
    for k in [
        "netns_cookie",
        "vni",
        "missing_fragments",
        "node_cache",
        "pod_proxy",
        "verdict",
    ] {
        assert!(table.contains(k), "{k} not in the tables");
    }
}

#[test]
fn every_json_field_is_documented() {
    let all = written();
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
