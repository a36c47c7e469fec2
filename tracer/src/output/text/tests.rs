use super::*;
use crate::{
    correlate::{
        record::{Join, LegOutcome, Outcome, Summary},
        LegRole,
    },
    decode::dns::{RrClass, RrType},
    detect::{
        loops::{LoopHop, LoopKind, LoopRecord, LoopState, Peer},
        race::{CounterDeltas, RaceNetns, RaceQuery, RaceRecord, RaceVerdict},
        Detection,
    },
    event::{Direction, KernelSetup},
    output::record::PodRef,
    output::record::{
        CtEndpoints, CtRecord, DecodeStats, HopRecord, KernelStats, LegDrop, LookupRef,
        QuestionRecord,
    },
    show::grouped,
    time::WallTime,
};

/// A name that, printed raw, colours the terminal, ends the line and forges a packet
/// line of its own, reverses what follows, rings the bell and (U+0085) breaks the line
/// for some readers.
const EVIL: &str =
    "\x1b[31mFAKE\n21:00:00.000000 evil/eth0 out udp 1.2.3.4:53 > 5.6.7.8:53 forged.\r\u{202e}\x07\u{85}\x7f";
/// How [`EVIL`] must appear.
const EVIL_SHOWN: &str =
    "\\x1b[31mFAKE\\x0a21:00:00.000000 evil/eth0 out udp 1.2.3.4:53 > 5.6.7.8:53 forged.\\x0d\\u{202e}\\x07\\x85\\x7f";
/// 2026-11-30T21:17:27.123456Z as Unix-epoch nanoseconds.
const WALL_NS: u64 = 1_796_073_447_123_456_000;

fn evil() -> String {
    EVIL.to_string()
}

/// A packet record's endpoint at the socket address `a`.
fn sock(a: &str) -> crate::decode::ip::Endpoint {
    a.parse::<std::net::SocketAddr>().unwrap().into()
}

fn question() -> QuestionRecord {
    // Type and class are codes, written as mnemonics: only the name can be hostile.
    QuestionRecord::new(evil(), RrType(65534), RrClass(3))
}

/// Writes `r` with the text sink and checks the result: `lines` lines, each starting
/// as a line of its kind does, no control or invisible character but the line ends,
/// and every hostile string shown escaped (`shown` times at least).
fn check(r: &Record, lines: usize, shown: usize) -> String {
    let mut sink = TextSink::new(Vec::new());
    sink.write(r).unwrap();
    let out = String::from_utf8(sink.out).unwrap();
    let bad: Vec<char> = out
        .chars()
        .filter(|&c| c != '\n' && crate::output::escape(&c.to_string()) != c.to_string())
        .collect();
    assert!(bad.is_empty(), "raw {bad:?} in {out:?}");
    assert_eq!(out.lines().count(), lines, "{out}");
    for l in out.lines() {
        assert!(
            l.starts_with("21:17:27.123456 ") || l.starts_with("  ") || l.starts_with("--- "),
            "line not of its kind: {l:?}"
        );
    }
    assert!(
        !out.contains("\nFAKE") && !out.contains("\n21:00:00"),
        "{out}"
    );
    assert!(
        out.matches(EVIL_SHOWN).count() >= shown,
        "{shown} escaped names expected in {out}"
    );
    out
}

#[test]
fn hostile_packet_fields_are_escaped() {
    let p = PacketRecord {
        pod: Default::default(),
        ts_ns: 1,
        time: WallTime(WALL_NS),
        cpu: None,
        netns: evil().into(),
        netns_cookie: 1,
        ifname: evil().into(),
        ifindex: 2,
        dir: crate::event::Direction::Egress,
        proto: crate::decode::record::Proto::Udp,
        // Addresses are typed: nothing hostile can be in them.
        src: sock("10.0.0.1:5000"),
        dst: sock("10.0.0.2:53"),
        len: 60,
        caplen: 60,
        vlan: None,
        tunnel: None,
        dns: None,
        malformed: Some(evil()),
        capture_truncated: false,
    };
    let out = check(&Record::Packet(p), 1, 3);
    assert!(out.starts_with(&format!(
        "21:17:27.123456 {EVIL_SHOWN}/{EVIL_SHOWN} out udp"
    )));
}

#[test]
fn pods_replace_netns_names_and_are_escaped() {
    let pod = |veth| PodRef {
        pod: Some(format!("kube-system/{EVIL}")),
        pod_uid: Some("u".into()),
        container: Some(evil()),
        container_id: None,
        pod_veth: veth,
    };
    assert_eq!(
        at(
            "pid1:pause",
            "eth0",
            &PodRef {
                pod: Some("kube-system/coredns-5d".into()),
                ..Default::default()
            }
        ),
        "kube-system/coredns-5d/eth0"
    );
    assert_eq!(
        at(
            "host",
            "veth1",
            &PodRef {
                pod: Some("default/client".into()),
                pod_veth: true,
                ..Default::default()
            }
        ),
        "host/veth1(default/client)"
    );
    assert_eq!(
        at(
            "n",
            "",
            &PodRef {
                pod_uid: Some("0f5c".into()),
                ..Default::default()
            }
        ),
        "pod:0f5c"
    );
    assert_eq!(at("n", "lo", &PodRef::default()), "n/lo");
    for veth in [false, true] {
        let p = PacketRecord {
            pod: Some(std::sync::Arc::new(pod(veth))),
            ts_ns: 1,
            time: WallTime(WALL_NS),
            cpu: None,
            netns: "pid1:pause".into(),
            netns_cookie: 1,
            ifname: "eth0".into(),
            ifindex: 2,
            dir: crate::event::Direction::Egress,
            proto: crate::decode::record::Proto::Udp,
            src: sock("10.0.0.1:5000"),
            dst: sock("10.0.0.2:53"),
            len: 60,
            caplen: 60,
            vlan: None,
            tunnel: None,
            dns: None,
            malformed: None,
            capture_truncated: false,
        };
        let out = check(&Record::Packet(p.clone()), 1, 1);
        assert!(out.contains(&format!("kube-system/{EVIL_SHOWN}")), "{out}");
        assert_eq!(out.contains("pid1:pause"), veth, "{out}");
        // JSON: the fields as they are, the container too.
        let v = serde_json::to_value(Record::Packet(p)).unwrap();
        assert_eq!(v["pod"], format!("kube-system/{EVIL}"));
        assert_eq!(v["container"], EVIL);
        assert_eq!(v["pod_uid"], "u");
        assert_eq!(v.get("pod_veth").is_some(), veth);
        assert!(v.get("container_id").is_none());
    }
}

#[test]
fn hostile_drop_fields_are_escaped() {
    let d = DropRecord {
        evidence: None,
        pod: None,
        ts_ns: 1,
        time: WallTime(WALL_NS),
        cpu: 0,
        netns: evil().into(),
        netns_cookie: 1,
        ifname: evil().into(),
        ifindex: 2,
        reason: evil(),
        reason_code: None,
        confirm_failed: None,
        location: evil(),
        proto: crate::decode::record::Proto::Udp,
        src: evil(),
        dst: evil(),
        len: 60,
        ct: Some(CtRecord {
            status: 0x1a0,
            status_flags: vec!["DST_NAT"],
            confirmed: false,
            orig: CtEndpoints {
                src: evil(),
                dst: evil(),
            },
            reply: CtEndpoints {
                src: evil(),
                dst: evil(),
            },
        }),
        dns: None,
        malformed: Some(evil()),
        capture_truncated: false,
        fragment: None,
        benign: None,
    };
    check(&Record::Drop(Box::new(d.clone())), 1, 11);
    // Without an interface: the namespace alone.
    let d = DropRecord {
        pod: None,
        ifname: "".into(),
        ..d
    };
    let out = check(&Record::Drop(Box::new(d)), 1, 10);
    assert!(out.contains(&format!(" DROP {EVIL_SHOWN} udp")), "{out}");
}

#[test]
fn hostile_transaction_fields_are_escaped() {
    let hop = HopRecord {
        pod: Default::default(),
        ts_ns: 1,
        netns: evil().into(),
        ifname: evil().into(),
        dir: Direction::Egress,
        src: "10.0.0.1:5000".parse().unwrap(),
        dst: "10.0.0.2:53".parse().unwrap(),
        dns_id: 1,
        qr: false,
        latency_ns: None,
        tunnel: None,
    };
    let leg = |parent, role, outcome| LegRecord {
        id: 1,
        parent,
        role,
        proto: crate::decode::record::Proto::Udp,
        client: "10.0.0.1:5000".parse().unwrap(),
        server: "10.96.0.10:53".parse().unwrap(),
        backend: "10.0.0.2:53".parse().unwrap(),
        dns_id: 1,
        join: Join::Conntrack,
        outcome,
        rcode: Some(evil().into()),
        answers: vec![evil()],
        answer_cut: None,
        latency_ns: Some(1000),
        retransmits: 0,
        drop: Some(LegDrop {
            pod: Default::default(),
            ts_ns: 1,
            netns: evil().into(),
            ifname: evil().into(),
            reason: evil(),
            location: evil(),
            response: false,
            fragments: None,
            fragment_drops_ns: Vec::new(),
        }),
        node_cache: None,
        pod_proxy: None,
        hops: vec![
            hop.clone(),
            HopRecord {
                pod: Default::default(),
                qr: true,
                ..hop.clone()
            },
        ],
        race_drop: false,
        closes_loop: None,
        node: None,
    };
    let t = TransactionRecord {
        evidence: None,
        pod: Default::default(),
        id: 1,
        lookup: LookupRef { id: 1, step: 1 },
        ts_ns: 1,
        wall_ns: WALL_NS,
        client: "10.0.0.1:5000".parse().unwrap(),
        client_netns: evil().into(),
        question: question(),
        outcome: Outcome::Dropped,
        rcode: Some(evil().into()),
        answers: vec![evil()],
        answer_cut: None,
        latency_ns: None,
        summary: Summary::Dropped {
            reason: evil(),
            location: evil(),
            retried: true,
            at_client: false,
            part: None,
        },
        legs: vec![
            leg(None, LegRole::Query, LegOutcome::Dropped),
            leg(Some(0), LegRole::Forward, LegOutcome::Answered),
            leg(None, LegRole::Retry, LegOutcome::Truncated),
        ],
        nodes: Vec::new(),
    };
    // A first line, then two per leg.
    // First line: netns and name (the type is a code, written as its mnemonic), and the
    // drop's reason and location in the summary; per leg: rcode or drop (4), and two hops
    // of two names.
    check(
        &Record::Transaction(Box::new(t)),
        7,
        2 + 2 + 4 + 1 + 1 + 3 * 4,
    );
}

#[test]
fn loop_path_names_the_pods_of_its_servers() {
    let hop = |backend: &str, at: (&str, &str), pod: PodRef| LoopHop {
        from: Peer::Socket(
            format!("{backend}:40000")
                .replace(":53:", ":")
                .parse()
                .unwrap(),
        ),
        server: Some("10.96.0.10:53".parse().unwrap()),
        backend: Peer::Socket(backend.parse().unwrap()),
        at: Some((at.0.into(), at.1.into())),
        pod,
    };
    let coredns = |name: &str, veth| PodRef {
        pod: Some(format!("kube-system/{name}")),
        pod_uid: Some("u".into()),
        pod_veth: veth,
        ..Default::default()
    };
    let mut l = LoopRecord {
        evidence: None,
        id: 1,
        state: LoopState::Detected,
        kind: LoopKind::Cycle,
        ts_ns: 1,
        wall_ns: WALL_NS,
        question: question(),
        loop_plugin_probe: false,
        cycle: vec![
            hop(
                "10.244.1.4:53",
                ("node", "vdnsb"),
                coredns("coredns-b", true),
            ),
            hop("10.244.1.3:53", ("ns-a", "eth0"), coredns(EVIL, false)),
        ],
        hop_count: 2,
        rate_pps: 1,
        packets: 1,
        summarised: 0,
        clients: Vec::new(),
        first_seen_ns: 1,
        detected_ns: 1,
        last_seen_ns: 1,
    };
    let line = l.text();
    assert!(
        line.contains(
            "10.244.1.4:40000 → 10.96.0.10:53 ⇒DNAT 10.244.1.4:53 (node/vdnsb(kube-system/coredns-b))"
        ),
        "{line}"
    );
    assert!(
        line.contains(&format!("(kube-system/{}/eth0)", esc(EVIL))),
        "{line}"
    );
    assert!(!line.contains('\x1b') && !line.contains("ns-a"), "{line}");
    // No pod known: the path of namespaces and interfaces (as in JSON).
    for h in &mut l.cycle {
        h.pod = PodRef::default();
    }
    assert!(
        l.text().contains(
            " 10.244.1.4:40000 → 10.96.0.10:53 ⇒DNAT 10.244.1.4:53 (node/vdnsb) → 10.96.0.10:53 ⇒DNAT 10.244.1.3:53 (ns-a/eth0) "
        ),
        "{}",
        l.text()
    );
}

#[test]
fn hostile_loop_race_and_stats_fields_are_escaped() {
    let l = LoopRecord {
        evidence: None,
        id: 1,
        state: LoopState::Detected,
        kind: LoopKind::Cycle,
        ts_ns: 1,
        wall_ns: WALL_NS,
        question: question(),
        loop_plugin_probe: false,
        cycle: vec![LoopHop {
            from: Peer::Socket("10.244.1.3:40000".parse().unwrap()),
            server: Some("10.96.0.10:53".parse().unwrap()),
            backend: Peer::Socket("10.244.1.4:53".parse().unwrap()),
            at: Some((evil(), evil())),
            pod: Default::default(),
        }],
        hop_count: 2,
        rate_pps: 1,
        packets: 1,
        summarised: 0,
        clients: vec!["10.244.1.2:5000".parse().unwrap()],
        first_seen_ns: 1,
        detected_ns: 1,
        last_seen_ns: 1,
    };
    // Name, type, and the namespace and interface in the path (the zone is part of the
    // name).
    // The name, the zone, the hop's namespace and interface (not the type: a code).
    check(&Record::detected(l), 1, 3);
    let q = RaceQuery {
        dns_id: 1,
        question: question(),
        backend: "10.244.1.3:53".parse().unwrap(),
        offset_ns: 0,
    };
    let r = RaceRecord {
        evidence: None,
        pod: Default::default(),
        verdict: RaceVerdict::RaceDrop,
        ts_ns: 1,
        wall_ns: WALL_NS,
        netns: RaceNetns::Name(evil()),
        client: Some("10.244.1.2:5000".parse().unwrap()),
        client_netns: evil(),
        dropped: Some(q.clone()),
        sibling: Some(q),
        cpu: Some(1),
        counters: CounterDeltas::default(),
        counter_confirmed: true,
        kernel_confirm_failed: None,
        drop_reason: Some(evil()),
        drop_location: Some(evil()),
        retry_ns: None,
        total_delay_ns: None,
        drop_offset_ns: Some(1000),
    };
    // The name and type in the summary, the client's namespace, the two queries' types.
    // The name and the client's namespace (the types are codes).
    check(&Record::detected(r), 1, 2);
    let s = StatsRecord {
        decode: DecodeStats {
            kernel: Some(KernelStats {
                counters: Default::default(),
                setup: Some(KernelSetup {
                    release: evil(),
                    degraded: vec![evil()],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    check(&Record::Stats(Box::new(s)), 1, 1);
}

/// Non-UTF-8 names arrive lossily converted (U+FFFD), which text shows as is and JSON
/// keeps (not dropped); JSON escapes control characters itself.
#[test]
fn json_keeps_lossy_names_and_escapes_controls() {
    let name = String::from_utf8_lossy(b"eth\xff0").into_owned();
    let p = PacketRecord {
        pod: Default::default(),
        ts_ns: 1,
        time: WallTime(WALL_NS),
        cpu: None,
        netns: evil().into(),
        netns_cookie: 1,
        ifname: name.clone().into(),
        ifindex: 2,
        dir: crate::event::Direction::Egress,
        proto: crate::decode::record::Proto::Udp,
        src: sock("10.0.0.1:5000"),
        dst: sock("10.0.0.2:53"),
        len: 60,
        caplen: 60,
        vlan: None,
        tunnel: None,
        dns: None,
        malformed: None,
        capture_truncated: false,
    };
    let mut sink = crate::output::JsonSink::new(Vec::new(), Default::default());
    sink.write(&Record::Packet(p.clone())).unwrap();
    let out = String::from_utf8(sink.out).unwrap();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(!out.contains('\x1b'), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ifname"], "eth\u{fffd}0");
    assert_eq!(v["netns"], EVIL);
    let text = packet_line(&p);
    assert!(text.contains("/eth\u{fffd}0 out "), "{text}");
}

#[test]
fn a_leg_of_one_hop_says_hop() {
    let hop = HopRecord {
        pod: Default::default(),
        ts_ns: 1,
        netns: "node".into(),
        ifname: "eth0".into(),
        dir: Direction::Egress,
        src: "10.0.0.1:5000".parse().unwrap(),
        dst: "10.0.0.2:53".parse().unwrap(),
        dns_id: 1,
        qr: false,
        latency_ns: None,
        tunnel: None,
    };
    let mut leg = LegRecord {
        id: 1,
        parent: None,
        role: LegRole::Query,
        proto: crate::decode::record::Proto::Udp,
        client: "10.0.0.1:5000".parse().unwrap(),
        server: "10.0.0.2:53".parse().unwrap(),
        backend: "10.0.0.2:53".parse().unwrap(),
        dns_id: 1,
        join: Join::SameTuple,
        outcome: LegOutcome::Pending,
        rcode: None,
        answers: Vec::new(),
        answer_cut: None,
        latency_ns: None,
        retransmits: 0,
        drop: None,
        node_cache: None,
        pod_proxy: None,
        hops: vec![hop.clone()],
        race_drop: false,
        closes_loop: None,
        node: None,
    };
    let line = super::leg_line(&leg);
    assert!(line.ends_with("[same-tuple join, 1 hop]"), "{line}");
    leg.hops.push(hop);
    let line = super::leg_line(&leg);
    assert!(line.ends_with("[same-tuple join, 2 hops]"), "{line}");
}

#[test]
fn counts_and_rates_are_grouped_by_thousands() {
    assert_eq!(grouped(0), "0");
    assert_eq!(grouped(999), "999");
    assert_eq!(grouped(1_000), "1,000");
    assert_eq!(grouped(1_220_254), "1,220,254");
    assert_eq!(grouped(u64::MAX), "18,446,744,073,709,551,615");
}
