//! The agent's CPU per query, repeatable: synthetic queries through the runner, the
//! pipeline and the agent's own sinks ([`MetricsSink`], [`EventsSink`]), as `dnspath
//! agent` drives them, with no kernel and no clock. Ignored (a measurement, not a check):
//!
//! ```text
//! cargo test -p tracer --release --lib agent::run::cost_tests -- --ignored --nocapture
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*cost_tests*feed*' \
//!     target/release/deps/tracer-HASH agent::run::cost_tests --ignored --exact --test-threads=1
//! ```
//!
//! Instructions per query: callgrind's total over [`QUERIES`] (the events are made before
//! `feed`, which is all that is counted). With `DNSPATH_COST_FIRST_HOPS=1`, each message
//! is fed at its first hop only: what the path costs when the copies at the other hops
//! cost nothing.
use std::{
    collections::HashMap,
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, RwLock},
};

use super::*;
use crate::{
    decode::decoder::Decoder,
    event::SourceEvent,
    event::{CapturedPacket, ConntrackEvent, CtChange, CtFlow, Direction, ObservationPoint},
    kallsyms::Kallsyms,
    kube::Pod,
    names::Names,
    output::sink::Sinks,
    pipeline::{Pipeline, PipelineConfig},
    runner::{Runner, Tick},
};

/// Queries fed (at 10,000 a second: two seconds of traffic).
const QUERIES: usize = 20_000;
/// Client pods, each on its own veth.
const CLIENTS: u64 = 20;
const QUERY_GAP_NS: u64 = 100_000;
/// How much capture time one turn reads (a ring-buffer batch).
const TURN_NS: u64 = 1_000_000;
const START_NS: u64 = 1_000_000_000_000;

const NODE: u64 = 1;
const DNS_POD: u64 = 2;
const DNS_VETH: u32 = 5;
const SERVICE: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)), 53);
const BACKEND: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 244, 0, 5)), 53);

fn client_netns(k: u64) -> u64 {
    100 + k
}

fn client_veth(k: u64) -> u32 {
    10 + k as u32
}

/// `name A` (id `id`), or its answer.
fn dns(id: u16, name: &str, response: bool) -> Vec<u8> {
    use hickory_proto::{
        op::{Message, MessageType, OpCode, Query},
        rr::{rdata::A, Name, RData, Record as HRecord, RecordType},
    };
    let name = Name::from_ascii(name).unwrap();
    let kind = if response {
        MessageType::Response
    } else {
        MessageType::Query
    };
    let mut m = Message::new(id, kind, OpCode::Query);
    m.add_query(Query::query(name.clone(), RecordType::A));
    if response {
        m.add_answer(HRecord::from_rdata(
            name,
            30,
            RData::A(A::new(10, 96, 3, 7)),
        ));
    }
    m.to_vec().unwrap()
}

fn udp(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        unreachable!()
    };
    let mut p = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, 17, 0, 0];
    p[2..4].copy_from_slice(&(28 + payload.len() as u16).to_be_bytes());
    p.extend_from_slice(&s.octets());
    p.extend_from_slice(&d.octets());
    p.extend_from_slice(&src.port().to_be_bytes());
    p.extend_from_slice(&dst.port().to_be_bytes());
    p.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

fn packet(ts_ns: u64, netns: u64, ifindex: u32, dir: Direction, data: &[u8]) -> (u64, SourceEvent) {
    let ev = SourceEvent::Packet(CapturedPacket {
        ts_ns,
        cpu: Some(0),
        at: ObservationPoint {
            netns,
            ifindex,
            dir,
        },
        vlan: None,
        orig_len: data.len() as u32,
        data: bytes::Bytes::copy_from_slice(data),
    });
    (ts_ns, ev)
}

/// Query `i`'s eight hops (both ends of the client's veth and of the DNS pod's, there and
/// back, DNATed between them) and the node's conntrack entry, by time.
fn query(i: usize) -> Vec<(u64, SourceEvent)> {
    let k = i as u64 % CLIENTS;
    let client = SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, 244, 0, 10 + k as u8)),
        20_000 + (i % 40_000) as u16,
    );
    let id = (i * 7 + 1) as u16;
    let name = format!("svc-{}.default.svc.cluster.local.", i % 50);
    let (q, r) = (dns(id, &name, false), dns(id, &name, true));
    let t = START_NS + i as u64 * QUERY_GAP_NS;
    let (ns, veth) = (client_netns(k), client_veth(k));
    let ct = SourceEvent::Conntrack(ConntrackEvent {
        ts_ns: t + 30_000,
        netns: NODE,
        change: CtChange::New,
        status: 0,
        zone: 0,
        orig: CtFlow {
            src: client,
            dst: SERVICE,
            proto: 17,
        },
        reply: CtFlow {
            src: BACKEND,
            dst: client,
            proto: 17,
        },
    });
    let (to_svc, to_pod) = (udp(client, SERVICE, &q), udp(client, BACKEND, &q));
    let (from_pod, from_svc) = (udp(BACKEND, client, &r), udp(SERVICE, client, &r));
    let (e, i_) = (Direction::Egress, Direction::Ingress);
    // The floor of a design where the kernel's copies cost userspace nothing: each message
    // at its first hop only (the query leaving the client, the answer leaving the DNS pod).
    if std::env::var_os("DNSPATH_COST_FIRST_HOPS").is_some() {
        return vec![
            packet(t, ns, 2, e, &to_svc),
            (t + 30_000, ct),
            packet(t + 180_000, DNS_POD, 2, e, &from_pod),
        ];
    }
    vec![
        packet(t, ns, 2, e, &to_svc),
        packet(t + 4_000, NODE, veth, i_, &to_svc),
        packet(t + 12_000, NODE, DNS_VETH, e, &to_pod),
        (t + 30_000, ct),
        packet(t + 16_000, DNS_POD, 2, i_, &to_pod),
        packet(t + 180_000, DNS_POD, 2, e, &from_pod),
        packet(t + 184_000, NODE, DNS_VETH, i_, &from_pod),
        packet(t + 190_000, NODE, veth, e, &from_svc),
        packet(t + 194_000, ns, 2, i_, &from_svc),
    ]
}

/// The turns: each the events read in [`TURN_NS`] of capture time (conntrack first, as
/// the engine gathers them), and its time.
fn turns() -> Vec<(u64, Vec<SourceEvent>)> {
    let mut all: Vec<(u64, SourceEvent)> = (0..QUERIES).flat_map(query).collect();
    all.sort_by_key(|(ts, _)| *ts);
    let mut turns: Vec<(u64, Vec<SourceEvent>)> = Vec::new();
    for (ts, ev) in all {
        let end = START_NS + (ts - START_NS) / TURN_NS * TURN_NS + TURN_NS;
        match turns.last_mut() {
            Some((e, evs)) if *e == end => evs.push(ev),
            _ => turns.push((end, vec![ev])),
        }
    }
    for (_, evs) in &mut turns {
        evs.sort_by_key(|ev| !matches!(ev, SourceEvent::Conntrack(_)));
    }
    turns
}

fn names() -> Arc<RwLock<Names>> {
    let mut names = Names::default();
    let pod = |label: String| {
        Arc::new(Pod {
            uid: format!("uid-{label}"),
            label: Some(label),
            container: None,
            container_id: None,
        })
    };
    let (mut pods, mut veths) = (HashMap::new(), HashMap::new());
    names.learn(NODE, "host", DNS_VETH, "veth-coredns");
    names.learn(DNS_POD, "pid2:coredns", 2, "eth0");
    pods.insert(DNS_POD, pod("kube-system/coredns-1".into()));
    veths.insert(
        (NODE, "veth-coredns".to_string()),
        pod("kube-system/coredns-1".into()),
    );
    for k in 0..CLIENTS {
        let veth = format!("veth-client-{k}");
        names.learn(client_netns(k), &format!("pid{k}:client"), 2, "eth0");
        names.learn(NODE, "host", client_veth(k), &veth);
        let p = pod(format!("default/client-{k}"));
        pods.insert(client_netns(k), Arc::clone(&p));
        veths.insert((NODE, veth), p);
    }
    names.set_pods(pods, veths);
    Arc::new(RwLock::new(names))
}

/// Everything the agent's main thread does with the turns; the transactions reported.
#[inline(never)]
fn feed(
    turns: Vec<(u64, Vec<SourceEvent>)>,
    runner: &mut Runner,
    sinks: &mut Sinks<'_>,
) -> io::Result<()> {
    let mut policy = StopPolicy::default();
    let mut last = 0;
    for (at, mut events) in turns {
        let tick = Tick::Live {
            clock_ns: at,
            behind: false,
        };
        runner.turn(&mut events, tick, sinks, &mut policy, at)?;
        last = at;
    }
    runner.finish(last + 10_000_000_000, sinks, &mut policy)
}

#[test]
#[ignore = "a measurement: run under callgrind (see the module's doc)"]
fn agent_cost_per_query() {
    let turns = turns();
    let names = names();
    let mut decoder = Decoder::new(
        Clock::Epoch,
        Arc::clone(&names),
        Kallsyms::default(),
        HashMap::new(),
    );
    decoder.unusual_packets_only();
    let pipeline = Pipeline::new(
        decoder,
        PipelineConfig {
            transactions: true,
            timeout_ns: 5_000_000_000,
            shed_loops: true,
            node_netns: Some(NODE),
        },
        Clock::Epoch,
    );
    let metrics = Arc::new(Metrics::with_config(MetricsConfig::default()));
    let health = Arc::new(Health::new(DEFAULT_STALE_AFTER));
    let unreadable = Arc::new(AtomicU64::new(0));
    let mut sinks = Sinks::new();
    sinks.push(Box::new(MetricsSink {
        metrics: Arc::clone(&metrics),
        health,
        netns_unreadable: Arc::clone(&unreadable),
    }));
    sinks.push(Box::new(EventsSink {
        metrics: Arc::clone(&metrics),
        events: EventSink::new(
            EventsConfig::default(),
            Clock::Epoch,
            QueuedLines::spawn("events", EVENT_LINES, io::sink()).unwrap(),
        ),
        events_failed: None,
        netns_unreadable: unreadable,
    }));
    let mut runner = Runner::new(pipeline, names, &sinks, 0);
    feed(turns, &mut runner, &mut sinks).unwrap();
    let stats = runner.stats();
    let c = stats.correlate.unwrap();
    eprintln!(
        "{QUERIES} queries: {} transactions, {} legs, orphans {}",
        c.transactions, c.legs, c.orphan_responses
    );
    assert_eq!(c.transactions, QUERIES as u64);
    assert_eq!(c.legs, QUERIES as u64);
    let text = metrics.encode();
    for l in text.lines().filter(|l| {
        !l.starts_with('#') && (l.contains("transactions_total") || l.contains("legs_total"))
    }) {
        eprintln!("{l}");
    }
}
