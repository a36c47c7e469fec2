use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::any_value::Value,
    trace::v1::span::{Event, SpanKind},
};
use prost::Message;

use super::*;
use crate::event::Direction;
use crate::{
    output::record::{LegDrop, Record},
    test_support::fixtures::{self, addr},
};

fn hop(ts_ns: u64, netns: &str, dir: Direction, src: &str, dst: &str, qr: bool) -> HopRecord {
    fixtures::hop(ts_ns, netns, dir, src, dst, qr, Some(1000))
}

/// The fixture's client → Service → CoreDNS pod → upstream, with the hops of one node.
fn tx(client_dir: Direction) -> TransactionRecord {
    let Record::Transaction(t) =
        fixtures::service_transaction("www.lab.test.", "A", 40005, "NOERROR")
    else {
        unreachable!()
    };
    let mut t = *t;
    use Direction::{Egress, Ingress};
    let c = "10.244.1.2:40005";
    t.legs[0].hops = vec![
        // From another node (ingress), the Service's DNAT was done there.
        if client_dir == Direction::Ingress {
            hop(1_000, "node", client_dir, c, "10.244.1.3:53", false)
        } else {
            hop(1_000, "client", client_dir, c, "10.96.0.10:53", false)
        },
        hop(2_000, "node", Egress, c, "10.244.1.3:53", false),
        hop(3_000, "coredns", Ingress, c, "10.244.1.3:53", false),
        hop(400_000, "coredns", Egress, "10.244.1.3:53", c, true),
        hop(631_000, "client", Ingress, "10.96.0.10:53", c, true),
    ];
    t.legs[1].hops = vec![
        hop(
            5_000,
            "coredns",
            Egress,
            "10.244.1.3:40000",
            "10.250.0.53:53",
            false,
        ),
        hop(
            6_000,
            "upstream",
            Ingress,
            "10.244.1.3:40000",
            "10.250.0.53:53",
            false,
        ),
        hop(
            270_000,
            "upstream",
            Egress,
            "10.250.0.53:53",
            "10.244.1.3:40000",
            true,
        ),
        hop(
            278_000,
            "coredns",
            Ingress,
            "10.250.0.53:53",
            "10.244.1.3:40000",
            true,
        ),
    ];
    t
}

fn by_name<'a>(spans: &'a [PlacedSpan], name: &str) -> &'a Span {
    &spans
        .iter()
        .find(|p| p.span.name == name)
        .unwrap_or_else(|| panic!("no span {name}"))
        .span
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a Value> {
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

#[test]
fn a_service_query_is_a_tree_of_spans() {
    let cfg = SpanConfig {
        node: Some("node-a".into()),
        ..Default::default()
    };
    let t = tx(Direction::Egress);
    let (ids, spans) = build(&cfg, &t);
    assert_eq!(spans.len(), 5, "root, 2 client spans, 2 server spans");
    assert!(spans.iter().all(|p| p.span.trace_id == ids.trace));
    let root = by_name(&spans, "DNS A");
    let query = by_name(&spans, "query A");
    let forward = by_name(&spans, "forward A");
    let serves: Vec<&Span> = spans
        .iter()
        .map(|p| &p.span)
        .filter(|s| s.name == "serve A")
        .collect();
    assert!(root.parent_span_id.is_empty());
    assert_eq!(root.kind, SpanKind::Internal as i32);
    assert_eq!(query.parent_span_id, root.span_id);
    assert_eq!(query.kind, SpanKind::Client as i32);
    // CoreDNS serves the client's query; its forward is a child of that server span, and
    // the upstream's server span a child of the forward.
    let coredns = serves
        .iter()
        .find(|s| s.parent_span_id == query.span_id)
        .expect("coredns server span");
    assert_eq!(forward.parent_span_id, coredns.span_id);
    assert!(serves.iter().any(|s| s.parent_span_id == forward.span_id));
    assert_eq!(query.events.len(), 5);
    assert!(query.events.iter().all(|e| e.name == "hop"));
    assert_eq!(
        query.events[0].time_unix_nano, t.wall_ns,
        "hop times in wall-clock time"
    );
    assert_eq!(root.end_time_unix_nano - root.start_time_unix_nano, 630_000);
    assert_eq!(
        coredns.end_time_unix_nano - coredns.start_time_unix_nano,
        397_000
    );
    assert_eq!(
        attr(root, "dns.question.name"),
        Some(&Value::StringValue("www.lab.test.".into()))
    );
    assert_eq!(
        attr(root, "dnspath.query_key"),
        Some(&Value::StringValue(ids::hex(&ids.query_key)))
    );
    assert_eq!(
        root.status.as_ref().map(|s| s.code),
        Some(StatusCode::Unset as i32)
    );
    let res = &spans
        .iter()
        .find(|p| p.span.name == "DNS A")
        .unwrap()
        .resource;
    assert!(res.attributes.iter().any(|kv| kv.key == "k8s.node.name"));
}

/// A leg's words are those of its JSON (`tcp-fallback`, `same-tuple`), not spellings of
/// their own.
#[test]
fn leg_words_are_those_of_the_json() {
    let mut t = tx(Direction::Egress);
    t.legs[0].role = LegRole::TcpFallback;
    t.legs[0].proto = crate::decode::record::Proto::Tcp;
    t.legs[0].join = crate::correlate::record::Join::SameTuple;
    let (_, spans) = build(&SpanConfig::default(), &t);
    let leg = by_name(&spans, "tcp-fallback A");
    let json = serde_json::to_value(&t.legs[0]).unwrap();
    for (key, field) in [
        ("dnspath.leg_role", "role"),
        ("dnspath.join", "join"),
        ("dnspath.outcome", "outcome"),
        ("network.transport", "proto"),
    ] {
        let word = json[field].as_str().unwrap();
        assert_eq!(
            attr(leg, key),
            Some(&Value::StringValue(word.into())),
            "{key}"
        );
    }
    assert_eq!(
        attr(leg, "dnspath.leg_role"),
        Some(&Value::StringValue("tcp-fallback".into()))
    );
    assert_eq!(
        attr(leg, "dnspath.join"),
        Some(&Value::StringValue("same-tuple".into()))
    );
}

/// Node B sees the query arrive from node A's client: no root, no client span of its own,
/// and its server span's parent is node A's client span, by id alone.
#[test]
fn the_serving_node_names_the_client_nodes_span() {
    let cfg = SpanConfig::default();
    let (a_ids, a) = build(&cfg, &tx(Direction::Egress));
    let (b_ids, b) = build(&cfg, &tx(Direction::Ingress));
    assert_eq!(a_ids, b_ids);
    assert!(b
        .iter()
        .all(|p| p.span.name != "DNS A" && p.span.name != "query A"));
    let a_query = by_name(&a, "query A");
    let b_serve = b
        .iter()
        .map(|p| &p.span)
        .find(|s| s.parent_span_id == a_query.span_id)
        .expect("B's server span under A's client span");
    assert_eq!(b_serve.name, "serve A");
    assert_eq!(b_serve.events.len(), 5, "B's hops on its server span");
}

/// Node B sees node A's client's query arrive, and its last hop here leaves the node (no
/// delivery seen, so no SERVER span), yet a forwarder's query from the backend follows: the
/// forward's CLIENT span names node A's client span, which exists there, never an id no node
/// writes (found by the otlp fuzz target).
#[test]
fn a_forward_of_a_query_not_seen_delivered_names_the_client_nodes_span() {
    let cfg = SpanConfig::default();
    let (_, a) = build(&cfg, &tx(Direction::Egress));
    let mut t = tx(Direction::Ingress);
    t.legs[0].hops.truncate(2);
    assert!(delivery(&t.legs[0]).is_none());
    let (_, b) = build(&cfg, &t);
    let a_query = by_name(&a, "query A");
    let forward = by_name(&b, "forward A");
    assert_eq!(forward.parent_span_id, a_query.span_id);
    assert!(b.iter().all(|p| p.span.span_id != a_query.span_id));
    assert_eq!(crate::fuzzing::check_otlp(&cfg, &t), Ok(b.len() as u64));
}

#[test]
fn a_drop_is_an_error_event() {
    let mut t = tx(Direction::Egress);
    let mut leg = fixtures::dropped(t.legs[0].clone(), "NETFILTER_DROP");
    leg.hops.truncate(2);
    leg.drop = Some(LegDrop {
        ts_ns: 2_500,
        netns: "node".into(),
        ifname: "vcoredns".into(),
        pod: Default::default(),
        reason: "NETFILTER_DROP".into(),
        location: "nf_hook_slow+0x9e".into(),
        response: false,
        fragments: None,
        fragment_drops_ns: Vec::new(),
    });
    let t2 = fixtures::transaction("www.lab.test.", "A", "10.244.1.2:40005", None, vec![leg]);
    t.legs = t2.legs;
    t.outcome = t2.outcome;
    t.summary = t2.summary;
    t.rcode = None;
    t.latency_ns = None;
    assert!(t.troubled());
    let (_, spans) = build(&SpanConfig::default(), &t);
    let query = by_name(&spans, "query A");
    let drop = query
        .events
        .iter()
        .find(|e| e.name == "kernel drop")
        .expect("drop event");
    assert!(drop
        .attributes
        .iter()
        .any(|kv| kv.key == "dnspath.drop.reason"));
    assert_eq!(
        query.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );
    let root = by_name(&spans, "DNS A");
    assert_eq!(
        root.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );
    assert!(
        spans.iter().all(|p| p.span.name != "serve A"),
        "never delivered"
    );
}

#[test]
fn redaction_leaves_no_name() {
    let mut t = tx(Direction::Egress);
    t.answers = vec!["A 10.250.0.80".into(), "CNAME secret.lab.test.".into()];
    t.legs[0].answers = t.answers.clone();
    let cfg = SpanConfig {
        redact_names: true,
        ..Default::default()
    };
    let (_, spans) = build(&cfg, &t);
    for p in &spans {
        let bytes = p.span.encode_to_vec();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("lab.test"), "{}", p.span.name);
        assert!(!text.contains("10.250.0.80"));
    }
    let (_, open) = build(&SpanConfig::default(), &t);
    let bytes: Vec<u8> = open.iter().flat_map(|p| p.span.encode_to_vec()).collect();
    assert!(String::from_utf8_lossy(&bytes).contains("secret.lab.test."));
}

/// A pod's veth on the node side, its pod unknown.
fn veth() -> std::sync::Arc<PodRef> {
    std::sync::Arc::new(PodRef {
        pod_veth: true,
        ..PodRef::default()
    })
}

/// Traced in the node's namespace only: the client's query arrives from its pod's veth
/// (ingress, still to the Service) and is handed to CoreDNS's veth (egress): a client of this
/// node, served here.
#[test]
fn node_namespace_only_is_still_a_local_client() {
    let mut t = tx(Direction::Egress);
    t.legs[0].hops[0].dir = Direction::Ingress;
    t.legs[0].hops[1].pod = Some(veth());
    t.legs[0].hops.remove(2);
    let (_, spans) = build(&SpanConfig::default(), &t);
    let root = by_name(&spans, "DNS A");
    let query = by_name(&spans, "query A");
    assert_eq!(query.parent_span_id, root.span_id);
    assert!(spans
        .iter()
        .any(|p| p.span.name == "serve A" && p.span.parent_span_id == query.span_id));
    // A direct query to a pod address, arriving from a pod's veth: local too.
    let mut t = tx(Direction::Ingress);
    t.legs[0].hops[0].pod = Some(veth());
    let (_, spans) = build(&SpanConfig::default(), &t);
    assert!(spans.iter().any(|p| p.span.name == "DNS A"));
}

/// Every event of every span, by name.
fn event_names(spans: &[PlacedSpan]) -> Vec<&str> {
    spans
        .iter()
        .flat_map(|p| p.span.events.iter().map(|e| e.name.as_str()))
        .collect()
}

fn is_error(s: &Span) -> bool {
    s.status.as_ref().map(|s| s.code) == Some(StatusCode::Error as i32)
}

fn event_attr<'a>(e: &'a Event, key: &str) -> Option<&'a Value> {
    e.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

/// A healthy query's spans carry hops only: no race, loop, drop or fragment loss, no error.
#[test]
fn a_healthy_query_has_no_incident_events() {
    let t = tx(Direction::Egress);
    assert!(!t.troubled());
    assert_eq!(t.first_loop(), None);
    let (_, spans) = build(&SpanConfig::default(), &t);
    assert!(event_names(&spans).iter().all(|&n| n == "hop"));
    assert!(spans.iter().all(|p| !is_error(&p.span)));
}

/// The client's first query lost to the conntrack race, answered on its retry: the lost
/// leg's span has a `conntrack race` event and is an error; the root names the race and
/// when the client tried again.
#[test]
fn a_race_drop_is_a_race_event() {
    use Direction::Egress;
    let c = "10.244.1.2:40005";
    let mut lost = fixtures::dropped(
        fixtures::leg(
            LegRole::Query,
            c,
            "10.96.0.10:53",
            "10.244.1.3:53",
            None,
            None,
        ),
        "NETFILTER_DROP",
    );
    lost.race_drop = true;
    lost.hops = vec![hop(1_000, "client", Egress, c, "10.96.0.10:53", false)];
    if let Some(d) = lost.drop.as_mut() {
        d.ts_ns = 2_000;
    }
    let mut retry = fixtures::leg(
        LegRole::Retry,
        c,
        "10.96.0.10:53",
        "10.244.1.4:53",
        Some("NOERROR"),
        Some(300_000),
    );
    retry.hops = vec![hop(
        5_000_001_000,
        "client",
        Egress,
        c,
        "10.96.0.10:53",
        false,
    )];
    let mut t = fixtures::transaction("api.lab.test.", "A", c, Some("NOERROR"), vec![lost, retry]);
    t.summary = Summary::Answered(Answered::AfterTimeout {
        timeout_ns: 5_000_000_000,
        drop: Some(("NETFILTER_DROP".into(), "nf_hook_slow+0x9e".into())),
    });
    assert!(t.troubled());
    let (_, spans) = build(&SpanConfig::default(), &t);
    let query = by_name(&spans, "query A");
    assert!(is_error(query));
    assert!(query
        .status
        .as_ref()
        .is_some_and(|s| s.message.contains("conntrack race")));
    let e = query
        .events
        .iter()
        .find(|e| e.name == "conntrack race")
        .expect("race event on the lost leg");
    assert_eq!(e.time_unix_nano, t.wall_ns + 1_000);
    assert!(query.events.iter().all(|e| e.name != "kernel drop"));
    let root = by_name(&spans, "DNS A");
    let e = root
        .events
        .iter()
        .find(|e| e.name == "conntrack race")
        .expect("race event on the root");
    assert_eq!(
        event_attr(e, "dnspath.retry_after_ns"),
        Some(&Value::IntValue(5_000_000_000))
    );
    assert_eq!(
        event_attr(e, "network.peer.address"),
        Some(&Value::StringValue("10.244.1.3".into()))
    );
    assert!(!is_error(by_name(&spans, "retry A")));
    // The same drop without the race's evidence is a kernel drop, not a race.
    t.legs[0].race_drop = false;
    let (_, spans) = build(&SpanConfig::default(), &t);
    let names = event_names(&spans);
    assert!(names.contains(&"kernel drop") && !names.contains(&"conntrack race"));
}

/// CoreDNS A forwards to CoreDNS B, which forwards back to A: the closing leg's span and
/// the root carry the cycle, first server to last.
#[test]
fn a_forwarding_cycle_is_a_loop_event() {
    use Direction::{Egress, Ingress};
    let mut t = tx(Direction::Egress);
    t.legs[1].backend = addr("10.244.2.3:53");
    t.legs[1].server = addr("10.244.2.3:53");
    for h in &mut t.legs[1].hops {
        if h.qr {
            h.src = addr("10.244.2.3:53");
        } else {
            h.dst = addr("10.244.2.3:53");
        }
        h.netns = if h.netns.as_ref() == "upstream" {
            "coredns-b".into()
        } else {
            h.netns.clone()
        };
    }
    let mut back = fixtures::leg(
        LegRole::Forward,
        "10.244.2.3:40001",
        "10.244.1.3:53",
        "10.244.1.3:53",
        None,
        None,
    );
    back.parent = Some(1);
    back.hops = vec![
        hop(
            7_000,
            "coredns-b",
            Egress,
            "10.244.2.3:40001",
            "10.244.1.3:53",
            false,
        ),
        hop(
            8_000,
            "coredns",
            Ingress,
            "10.244.2.3:40001",
            "10.244.1.3:53",
            false,
        ),
    ];
    t.legs.push(back);
    // The spans read the correlator's mark; they do not find cycles themselves.
    let (_, spans) = build(&SpanConfig::default(), &t);
    assert!(!event_names(&spans).contains(&"forwarding loop"));
    t.legs[2].closes_loop = Some(Box::new(LegLoop {
        cycle: vec![1, 2],
        hop_count: 2,
    }));
    assert!(t.troubled());
    let (_, spans) = build(
        &SpanConfig {
            node: Some("node-a".into()),
            ..Default::default()
        },
        &t,
    );
    let closing = spans
        .iter()
        .map(|p| &p.span)
        .filter(|s| s.name == "forward A")
        .find(|s| s.events.iter().any(|e| e.name == "forwarding loop"))
        .expect("loop event on the closing leg");
    assert!(is_error(closing));
    let root = by_name(&spans, "DNS A");
    let e = root
        .events
        .iter()
        .find(|e| e.name == "forwarding loop")
        .expect("loop event on the root");
    let servers = match event_attr(e, "dnspath.loop.servers") {
        Some(Value::ArrayValue(a)) => a
            .values
            .iter()
            .filter_map(|v| match &v.value {
                Some(Value::StringValue(s)) => Some(s.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>(),
        x => panic!("{x:?}"),
    };
    assert_eq!(servers, ["10.244.2.3:53", "10.244.1.3:53"]);
    assert_eq!(
        event_attr(e, "k8s.node.name"),
        Some(&Value::StringValue("node-a".into()))
    );
    // The root answered, but the question looped: an error.
    assert!(is_error(root));
}

/// An upstream's answer lost for want of a fragment: a `fragment loss` event on the leg.
#[test]
fn a_lost_fragment_is_a_fragment_loss_event() {
    let mut t = tx(Direction::Egress);
    let mut l = fixtures::dropped(t.legs[1].clone(), crate::correlate::FRAGMENT_LOSS);
    l.hops.truncate(3);
    if let Some(d) = l.drop.as_mut() {
        d.response = true;
        d.location = "ip_defrag".into();
    }
    t.legs[1] = l;
    assert!(t.troubled());
    let (_, spans) = build(&SpanConfig::default(), &t);
    let fwd = by_name(&spans, "forward A");
    assert!(fwd.events.iter().any(|e| e.name == "fragment loss"));
    assert!(fwd.events.iter().all(|e| e.name != "kernel drop"));
    assert!(is_error(fwd));
    assert!(fwd
        .status
        .as_ref()
        .is_some_and(|s| s.message.contains("fragments missing")));
}

/// The fixture's transaction, `n`-th of a run (its own DNS id and transaction id).
fn nth_tx(n: u16) -> TransactionRecord {
    let mut t = tx(Direction::Egress);
    t.id = u64::from(n);
    t.lookup.id = u64::from(n);
    t.legs[0].dns_id = n;
    for h in &mut t.legs[0].hops {
        h.dns_id = n;
    }
    t
}

/// The hot thread's part: `Exporter::offer` of every transaction (sample 1), to an
/// exporter whose endpoint cannot be used (its thread drops what it receives).
#[inline(never)]
fn harness_offer(txs: &[TransactionRecord]) -> crate::output::otlp::OtlpStats {
    let mut c = crate::output::otlp::OtlpConfig::from_env(Some("http://[::1]:1"), None, |_| None)
        .unwrap()
        .unwrap();
    c.protocol = crate::output::otlp::Protocol::Grpc;
    c.endpoint = "not a URL".into();
    c.queue = txs.len();
    c.queue_bytes = usize::MAX / 2;
    let e = crate::output::otlp::Exporter::start(c).unwrap();
    for t in txs {
        e.offer(t);
    }
    e.finish()
}

/// The exporter thread's part but the network: spans, request, protobuf, gzip, in batches
/// of 512 as the exporter sends them; the bytes sent.
#[inline(never)]
fn harness_export(txs: &[TransactionRecord], gzip: bool) -> (u64, usize) {
    let cfg = SpanConfig {
        node: Some("node-a".into()),
        ..Default::default()
    };
    let (mut spans, mut bytes) = (0, 0);
    let mut requests = super::super::export::Requests::default();
    for batch in txs.chunks(512) {
        let (req, n) = requests.request(&cfg, batch.iter().map(|t| Box::new(t.clone())));
        spans += n;
        bytes += super::super::export::http_body(req, gzip).len();
    }
    (spans, bytes)
}

/// A harness for callgrind, not a test (docs/bench/README.md, "OTLP export's cost"): the
/// instructions of `harness_offer` and `harness_export` over N (`DNSPATH_OTLP_HARNESS_N`,
/// 2000) fixture transactions of 2 legs, 9 hops, 5 spans:
/// `valgrind --tool=callgrind target/release/deps/tracer-… cost_harness --ignored --exact`.
#[test]
#[ignore = "a harness for callgrind"]
fn cost_harness() {
    let n: u16 = std::env::var("DNSPATH_OTLP_HARNESS_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let txs: Vec<TransactionRecord> = (0..n).map(nth_tx).collect();
    let s = harness_offer(&txs);
    assert_eq!(s.sampled_out, 0);
    let gzip = std::env::var_os("DNSPATH_OTLP_HARNESS_PLAIN").is_none();
    let (spans, bytes) = harness_export(&txs, gzip);
    assert_eq!(spans, 5 * u64::from(n));
    eprintln!("{n} transactions, {spans} spans, {bytes} bytes (gzip {gzip})");
}

/// The request's bytes (`wire.rs`) are prost's (they decode and encode back the same) for
/// the spans of the tests' transactions:
/// a node's whole tree, the serving node's half (with its link to the neighbouring epoch),
/// redacted, drops, several resources in a request.
#[test]
fn requests_are_encoded_as_prost_encodes_them() {
    let mut near_boundary = tx(Direction::Ingress);
    near_boundary.wall_ns = 10 * ids::EPOCH_NS + 1_000;
    let mut dropped = tx(Direction::Egress);
    dropped.legs[1].drop = Some(LegDrop {
        ts_ns: 7_000,
        reason: "NETFILTER_DROP".into(),
        location: "nf_hook_slow".into(),
        netns: "coredns".into(),
        ifname: "eth0".into(),
        response: false,
        pod: Default::default(),
        fragments: None,
        fragment_drops_ns: Vec::new(),
    });
    let txs = [
        tx(Direction::Egress),
        tx(Direction::Ingress),
        near_boundary,
        dropped,
    ];
    for redact_names in [false, true] {
        let cfg = SpanConfig {
            node: Some("node-a".into()),
            redact_names,
            ..Default::default()
        };
        let (bytes, spans) =
            super::super::export::request(&cfg, txs.iter().chain(&[nth_tx(1), nth_tx(2)]));
        let req = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        assert!(spans > 10 && req.resource_spans.len() > 2, "{spans}");
        let all = || {
            req.resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .flat_map(|s| &s.spans)
        };
        assert_eq!(all().count() as u64, spans);
        assert!(all().map(|s| s.links.len()).sum::<usize>() > 0);
        assert_eq!(req.encode_to_vec(), bytes);
    }
}

/// A forwarder asking two upstreams at once from one socket with one DNS id (dnsmasq's
/// `all-servers`): two legs, two CLIENT spans with ids of their own; the first keeps the id
/// a serving node names as its parent.
#[test]
fn two_upstreams_asked_from_one_socket_and_id_are_two_spans() {
    let cfg = SpanConfig::default();
    let mut t = tx(Direction::Egress);
    let mut second = t.legs[1].clone();
    second.backend = addr("10.250.0.54:53");
    second.server = addr("10.250.0.54:53");
    for h in &mut second.hops {
        if h.qr {
            h.src = addr("10.250.0.54:53");
        } else {
            h.dst = addr("10.250.0.54:53");
        }
    }
    t.legs.push(second);
    let (ids, spans) = build(&cfg, &t);
    assert_eq!(spans.len(), 7, "root, 3 client spans, 3 server spans");
    assert_ids_distinct(&spans);
    let first = ids::span_id(
        &cfg.key,
        &ids.trace,
        ids::Role::Query {
            client: t.legs[1].client,
            proto: t.legs[1].proto.number(),
            dns_id: t.legs[1].dns_id,
        },
    );
    let forwards: Vec<&Span> = spans
        .iter()
        .map(|p| &p.span)
        .filter(|s| s.name == "forward A")
        .collect();
    assert_eq!(forwards.len(), 2);
    assert_eq!(forwards[0].span_id, first.to_vec());
    assert_ne!(forwards[1].span_id, first.to_vec());
    // Both are children of the CoreDNS pod's SERVER span.
    assert_eq!(forwards[0].parent_span_id, forwards[1].parent_span_id);
}

/// Node B serves two legs that node A's client sent from one socket with one DNS id (a
/// retry to the other CoreDNS pod): B cannot know how A counted them, so both SERVER
/// spans name the span A gives the first, which A always writes; never an id no node
/// writes (found by the otlp fuzz target).
#[test]
fn a_serving_node_names_the_first_of_a_sockets_repeated_queries() {
    let cfg = SpanConfig::default();
    let (_, a) = build(&cfg, &tx(Direction::Egress));
    let a_query = by_name(&a, "query A");
    let mut t = tx(Direction::Ingress);
    let mut again = t.legs[0].clone();
    again.role = LegRole::Retry;
    again.backend = addr("10.244.1.4:53");
    for h in &mut again.hops {
        if h.qr {
            h.src = addr("10.244.1.4:53");
        } else if h.dst == addr("10.244.1.3:53") {
            h.dst = addr("10.244.1.4:53");
        }
    }
    t.legs.insert(1, again);
    if let Some(f) = t.legs.get_mut(2) {
        f.parent = Some(0);
    }
    let (_, b) = build(&cfg, &t);
    let serves: Vec<&Span> = b
        .iter()
        .map(|p| &p.span)
        .filter(|s| s.name == "serve A" && s.kind == SpanKind::Server as i32)
        .filter(|s| s.parent_span_id == a_query.span_id)
        .collect();
    assert_eq!(serves.len(), 2, "both SERVER spans under A's first query");
    assert_ne!(serves[0].span_id, serves[1].span_id);
    assert_eq!(crate::fuzzing::check_otlp(&cfg, &t), Ok(b.len() as u64));
}

/// A client that sends its query again from the same socket with the same DNS id to the
/// same pod (a resend after a truncated answer or a timeout): two SERVER spans there, each
/// with an id of its own (found by the otlp fuzz target: one id for both).
#[test]
fn a_query_sent_again_to_the_same_pod_is_served_twice() {
    let cfg = SpanConfig::default();
    let mut t = tx(Direction::Egress);
    let mut again = t.legs[0].clone();
    again.role = LegRole::Retry;
    for h in &mut again.hops {
        h.ts_ns += 2_000_000;
    }
    t.legs.push(again);
    let (_, spans) = build(&cfg, &t);
    let serves: Vec<&Span> = spans
        .iter()
        .map(|p| &p.span)
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(serves.len(), 3, "the pod twice, the upstream once");
    assert_ids_distinct(&spans);
    assert_eq!(crate::fuzzing::check_otlp(&cfg, &t), Ok(spans.len() as u64));
}

fn assert_ids_distinct(spans: &[PlacedSpan]) {
    let distinct: std::collections::HashSet<&[u8]> =
        spans.iter().map(|p| p.span.span_id.as_slice()).collect();
    assert_eq!(
        distinct.len(),
        spans.len(),
        "every span has an id of its own"
    );
}

/// Addresses are written as `Display` writes them (IPv4 without the formatting machinery).
#[test]
fn addresses_are_shown_as_display_shows_them() {
    let mut text = String::new();
    for a in [
        "0.0.0.0:0",
        "255.255.255.255:65535",
        "10.244.1.2:40005",
        "1.20.100.9:53",
        "[::1]:53",
        "[fd00::a:2]:5353",
        "[::ffff:10.0.0.1]:1",
    ] {
        let a: SocketAddr = a.parse().unwrap();
        assert_eq!(shown_addr(&mut text, a), a.to_string());
        assert_eq!(shown_ip(&mut text, a.ip()), a.ip().to_string());
    }
    for n in [0u32, 9, 10, 99, 100, 65535, u32::MAX] {
        text.clear();
        push_decimal(&mut text, n);
        assert_eq!(text, n.to_string());
    }
}
