//! A decided transaction as OTLP spans (docs/otlp.md, "Spans"): a root span for the client's
//! question (INTERNAL, on the client's node), a CLIENT span per leg, a SERVER span where a
//! leg's query was delivered, parented as the legs' tree; hops, drops, conntrack races,
//! forwarding loops, late answers and fragment losses as events.
use std::net::SocketAddr;

use opentelemetry_proto::tonic::{
    common::v1::{any_value::Value, AnyValue, ArrayValue, KeyValue},
    resource::v1::Resource,
    trace::v1::{
        span::{Event, Link, SpanKind},
        status::StatusCode,
        Span, Status,
    },
};

use super::ids::{self, IdKey, QueryIdentity, Role};
use crate::{
    correlate::{
        record::{Answered, Join, LegLoop, LegOutcome, NodeCache, Outcome, Summary},
        LegRole, FRAGMENT_LOSS,
    },
    event::Direction,
    output::record::{HopRecord, LegRecord, PodRef, TransactionRecord},
};

/// What every transaction's spans are made with.
#[derive(Clone, Debug, Default)]
pub struct SpanConfig {
    pub key: IdKey,
    /// `--node-name`: `k8s.node.name` of every span's resource.
    pub node: Option<String>,
    /// `--otlp-redact-names`: no query name or answer in any span.
    pub redact_names: bool,
}

/// A transaction's ids: its trace and its epoch-free query key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceIds {
    pub trace: [u8; 16],
    pub query_key: [u8; 16],
}

/// The leg that carried the client's first query.
fn first_leg(tx: &TransactionRecord) -> Option<&LegRecord> {
    tx.legs.iter().find(|l| l.parent.is_none())
}

fn identity(tx: &TransactionRecord) -> QueryIdentity<'_> {
    let first = first_leg(tx);
    QueryIdentity {
        client: tx.client,
        proto: first.map_or(tracer_common::proto::IPPROTO_UDP, |l| l.proto),
        dns_id: first.map_or(0, |l| l.dns_id),
        name: &tx.question.name,
        qtype: tx.question.qtype,
        class: tx.question.class,
    }
}

/// The trace a transaction belongs to (cheap: two SipHash runs over some 60 bytes).
pub fn trace_ids(key: &IdKey, tx: &TransactionRecord) -> TraceIds {
    let query_key = ids::query_key(key, &identity(tx));
    TraceIds {
        trace: ids::trace_id(key, &query_key, ids::epoch(tx.wall_ns)),
        query_key,
    }
}

/// Exported whatever the sampling ratio: unanswered, dropped, late, SERVFAIL/REFUSED,
/// answered only after a timeout, a conntrack race, a forwarding loop.
pub fn failing(tx: &TransactionRecord) -> bool {
    tx.outcome != Outcome::Answered
        || matches!(tx.rcode.as_deref(), Some("SERVFAIL" | "REFUSED"))
        || matches!(
            tx.summary,
            Summary::Answered(Answered::AfterTimeout { .. }) | Summary::AnswerLost { .. }
        )
        || tx.legs.iter().any(|l| {
            matches!(
                l.outcome,
                LegOutcome::Dropped | LegOutcome::Late | LegOutcome::Unanswered
            ) || matches!(l.rcode.as_deref(), Some("SERVFAIL" | "REFUSED"))
                || l.race_drop
        })
        || tx.first_loop().is_some()
}

/// One span and the resource (pod, namespace, node) it happened in.
pub struct PlacedSpan {
    pub resource: Resource,
    pub span: Span,
}

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn s(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, Value::StringValue(v.into()))
}

fn i(key: &str, v: i64) -> KeyValue {
    kv(key, Value::IntValue(v))
}

fn strings(key: &str, v: &[String]) -> KeyValue {
    kv(
        key,
        Value::ArrayValue(ArrayValue {
            values: v
                .iter()
                .map(|a| AnyValue {
                    value: Some(Value::StringValue(a.clone())),
                })
                .collect(),
        }),
    )
}

fn transport(proto: u8) -> &'static str {
    if proto == tracer_common::proto::IPPROTO_TCP {
        "tcp"
    } else {
        "udp"
    }
}

fn outcome_word(o: Outcome) -> &'static str {
    match o {
        Outcome::Answered => "answered",
        Outcome::Dropped => "dropped",
        Outcome::Late => "late",
        Outcome::Pending => "pending",
        Outcome::Unanswered => "unanswered",
    }
}

fn leg_outcome_word(o: LegOutcome) -> &'static str {
    match o {
        LegOutcome::Answered => "answered",
        LegOutcome::Truncated => "truncated",
        LegOutcome::Dropped => "dropped",
        LegOutcome::Late => "late",
        LegOutcome::Pending => "pending",
        LegOutcome::Unanswered => "unanswered",
    }
}

fn role_word(r: LegRole) -> &'static str {
    match r {
        LegRole::Query => "query",
        LegRole::Retry => "retry",
        LegRole::TcpFallback => "tcp_fallback",
        LegRole::Forward => "forward",
    }
}

fn join_word(j: Join) -> &'static str {
    match j {
        Join::SameTuple => "same_tuple",
        Join::Conntrack => "conntrack",
        Join::Fallback => "fallback",
    }
}

fn node_cache_word(n: NodeCache) -> &'static str {
    match n {
        NodeCache::Hit => "hit",
        NodeCache::Miss => "miss",
        NodeCache::Bypass => "bypass",
    }
}

/// The workload a pod belongs to, from its name: a Deployment's pod
/// `coredns-5d78c9869d-x7k2p` is `coredns`, a DaemonSet's `node-local-dns-x7k2p`
/// `node-local-dns`; other names are kept.
fn workload(pod_name: &str) -> &str {
    fn hashy(seg: &str, min: usize, max: usize) -> bool {
        (min..=max).contains(&seg.len())
            && seg
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    }
    let mut name = pod_name;
    if let Some((rest, last)) = name.rsplit_once('-') {
        if hashy(last, 5, 5) && !rest.is_empty() {
            name = rest;
            if let Some((rest2, rs)) = name.rsplit_once('-') {
                if hashy(rs, 6, 10) && rs.bytes().any(|c| c.is_ascii_digit()) && !rest2.is_empty() {
                    name = rest2;
                }
            }
        }
    }
    name
}

/// Where a span happened: the pod (if the node knows it), its namespace and the node.
fn resource(pod: &PodRef, netns: &str, node: Option<&str>) -> Resource {
    let mut attributes = Vec::with_capacity(8);
    match pod.pod.as_deref().and_then(|p| p.split_once('/')) {
        Some((ns, name)) => {
            attributes.push(s("service.name", workload(name)));
            attributes.push(s("k8s.namespace.name", ns));
            attributes.push(s("k8s.pod.name", name));
        }
        None => attributes.push(s("service.name", netns)),
    }
    if let Some(uid) = &pod.pod_uid {
        attributes.push(s("k8s.pod.uid", uid.as_str()));
    }
    if let Some(c) = &pod.container {
        attributes.push(s("k8s.container.name", c.as_str()));
    }
    if let Some(c) = &pod.container_id {
        attributes.push(s("container.id", c.as_str()));
    }
    if let Some(n) = node {
        attributes.push(s("k8s.node.name", n));
    }
    attributes.push(s("dnspath.netns", netns));
    Resource {
        attributes,
        ..Default::default()
    }
}

fn status(error: Option<String>) -> Option<Status> {
    Some(match error {
        Some(message) => Status {
            message,
            code: StatusCode::Error as i32,
        },
        None => Status {
            message: String::new(),
            code: StatusCode::Unset as i32,
        },
    })
}

fn endpoint(prefix: &str, a: SocketAddr, out: &mut Vec<KeyValue>) {
    out.push(s(&format!("{prefix}.address"), a.ip().to_string()));
    out.push(i(&format!("{prefix}.port"), i64::from(a.port())));
}

/// Boot-clock nanoseconds → Unix nanoseconds, by the transaction's own pair of the two.
struct Wall {
    offset: i128,
}

impl Wall {
    fn of(&self, ts_ns: u64) -> u64 {
        u64::try_from((i128::from(ts_ns) + self.offset).max(0)).unwrap_or(u64::MAX)
    }
}

fn hop_event(h: &HopRecord, index: usize, wall: &Wall, node: Option<&str>) -> Event {
    let mut attributes = vec![
        i("dnspath.hop", i64::try_from(index).unwrap_or(i64::MAX)),
        s("dnspath.netns", h.netns.as_ref()),
        s("dnspath.ifname", h.ifname.as_ref()),
        s("dnspath.dir", h.dir.as_str()),
        s("dnspath.msg", if h.qr { "response" } else { "query" }),
        s("dnspath.src", h.src.to_string()),
        s("dnspath.dst", h.dst.to_string()),
    ];
    if let Some(p) = &h.pod.pod {
        attributes.push(s("dnspath.pod", p.as_str()));
    }
    if let Some(n) = node {
        attributes.push(s("k8s.node.name", n));
    }
    if let Some(l) = h.latency_ns {
        attributes.push(i(
            "dnspath.latency_ns",
            i64::try_from(l).unwrap_or(i64::MAX),
        ));
    }
    Event {
        time_unix_nano: wall.of(h.ts_ns),
        name: "hop".into(),
        attributes,
        dropped_attributes_count: 0,
    }
}

/// Whether the client is on this node (the root and the client spans are this node's),
/// rather than on another one (this node has only the served half; the root and the client
/// span are the other node's, and its server span names that client span as parent).
///
/// The query came from another node when its first hop here is an arrival (ingress) that
/// is not from a pod's veth, already addressed to the backend (a Service's DNAT is done on
/// the client's node), from a client no pod of this node is known as. Anything else — seen
/// leaving a namespace, arriving from a pod's veth, still addressed to a Service, a known
/// client pod, a capture with no direction — is a client of this node.
///
/// The agent's metrics count by the same rule (docs/metrics.md, `leg="served"`), so that a
/// question is one client question on the client's node only.
pub fn client_is_local(tx: &TransactionRecord) -> bool {
    let Some(leg) = first_leg(tx) else {
        return true;
    };
    let Some(h) = leg.hops.first() else {
        return true;
    };
    h.dir != Direction::Ingress || h.pod.pod_veth || h.dst != leg.backend || tx.pod.pod.is_some()
}

fn leg_error(l: &LegRecord) -> Option<String> {
    match l.outcome {
        LegOutcome::Dropped => Some(match &l.drop {
            Some(d) if d.reason == FRAGMENT_LOSS => {
                format!("answer lost: fragments missing at {}", d.location)
            }
            Some(d) if l.race_drop => format!("conntrack race: dropped at {}", d.location),
            Some(d) => format!("dropped: {} at {}", d.reason, d.location),
            None => "dropped".into(),
        }),
        LegOutcome::Late => Some("late: the answer came after the client gave up".into()),
        LegOutcome::Unanswered => Some("unanswered".into()),
        _ => match l.rcode.as_deref() {
            Some(r @ ("SERVFAIL" | "REFUSED")) => Some(r.to_string()),
            _ => None,
        },
    }
}

fn tx_error(tx: &TransactionRecord) -> Option<String> {
    match &tx.summary {
        Summary::Dropped {
            reason, location, ..
        } => Some(format!("dropped: {reason} at {location}")),
        Summary::Late { .. } => Some("late: the answer came after the client gave up".into()),
        Summary::AnswerLost { location, .. } => Some(format!("answer lost: {location}")),
        Summary::Unanswered { .. } => Some("unanswered".into()),
        Summary::Pending => None,
        Summary::Answered(_) => match tx.rcode.as_deref() {
            Some(r @ ("SERVFAIL" | "REFUSED")) => Some(r.to_string()),
            _ if tx.outcome != Outcome::Answered => Some(outcome_word(tx.outcome).into()),
            _ => None,
        },
    }
}

/// A leg's span times: its first hop to the response at its first point, else to the last
/// thing seen of it.
fn leg_times(l: &LegRecord, wall: &Wall, fallback_ns: u64) -> (u64, u64) {
    let start = l.hops.first().map_or(fallback_ns, |h| h.ts_ns);
    let end = match l.latency_ns {
        Some(lat) => start.saturating_add(lat),
        None => l
            .hops
            .iter()
            .map(|h| h.ts_ns)
            .chain(l.drop.as_ref().map(|d| d.ts_ns))
            .max()
            .unwrap_or(start),
    };
    (wall.of(start), wall.of(end.max(start)))
}

/// A leg's endpoints as `address:port` strings.
fn sockets<'a>(
    legs: impl Iterator<Item = &'a LegRecord>,
    f: fn(&LegRecord) -> SocketAddr,
) -> Vec<String> {
    legs.map(|l| f(l).to_string()).collect()
}

/// `forwarding loop`: the cycle's servers in order, each leg's forwarder and where it was
/// delivered, and the chain's length (as in the `loop` record, docs/output.md).
fn loop_event(tx: &TransactionRecord, lp: &LegLoop, time: u64, node: Option<&str>) -> Event {
    let legs = || lp.cycle.iter().filter_map(|&k| tx.legs.get(k));
    let mut attributes = vec![
        s("dnspath.loop.kind", "cycle"),
        strings("dnspath.loop.servers", &sockets(legs(), |l| l.backend)),
        strings("dnspath.loop.from", &sockets(legs(), |l| l.client)),
        strings(
            "dnspath.loop.netns",
            &legs()
                .map(|l| delivery(l).map_or(String::new(), |h| h.netns.to_string()))
                .collect::<Vec<_>>(),
        ),
        i(
            "dnspath.loop.hop_count",
            i64::try_from(lp.hop_count).unwrap_or(i64::MAX),
        ),
    ];
    if let Some(n) = node {
        attributes.push(s("k8s.node.name", n));
    }
    Event {
        time_unix_nano: time,
        name: "forwarding loop".into(),
        attributes,
        dropped_attributes_count: 0,
    }
}

/// `conntrack race` on the root: which of the client's queries the race dropped (its DNS
/// id, the backend DNAT chose), where, and when the client tried again.
fn race_event(tx: &TransactionRecord, wall: &Wall) -> Option<Event> {
    let roots = || tx.legs.iter().filter(|l| l.parent.is_none());
    let lost = roots().find(|l| l.race_drop)?;
    let start = lost.hops.first().map_or(tx.ts_ns, |h| h.ts_ns);
    let mut attributes = vec![
        s("dnspath.race.verdict", "race-drop"),
        i("dnspath.dns_id", i64::from(lost.dns_id)),
    ];
    endpoint("network.peer", lost.backend, &mut attributes);
    if let Some(d) = &lost.drop {
        attributes.push(s("dnspath.drop.reason", d.reason.as_str()));
        attributes.push(s("dnspath.drop.location", d.location.as_str()));
        attributes.push(s("dnspath.netns", d.netns.as_ref()));
    }
    if let Some(retry) = roots()
        .filter_map(|l| l.hops.first())
        .map(|h| h.ts_ns)
        .find(|&t| t > start)
    {
        attributes.push(i(
            "dnspath.retry_after_ns",
            i64::try_from(retry - start).unwrap_or(i64::MAX),
        ));
    }
    Some(Event {
        time_unix_nano: wall.of(lost.drop.as_ref().map_or(start, |d| d.ts_ns)),
        name: "conntrack race".into(),
        attributes,
        dropped_attributes_count: 0,
    })
}

struct LegIds {
    client: [u8; 8],
    server: Option<[u8; 8]>,
}

/// The role of leg `n`'s CLIENT span: [`Role::Query`], or [`Role::QueryAgain`] when an
/// earlier leg of `tx` was sent from the same socket with the same DNS id.
fn query_role(tx: &TransactionRecord, n: usize, l: &LegRecord) -> Role {
    let same = |o: &&LegRecord| o.client == l.client && o.proto == l.proto && o.dns_id == l.dns_id;
    let repeat = tx.legs.iter().take(n).filter(same).count();
    match u16::try_from(repeat) {
        Ok(0) => first_query(l),
        r => Role::QueryAgain {
            client: l.client,
            proto: l.proto,
            dns_id: l.dns_id,
            repeat: r.unwrap_or(u16::MAX),
        },
    }
}

/// The role of the first query sent from leg `l`'s socket with its DNS id: the CLIENT
/// span a serving node names as its parent.
fn first_query(l: &LegRecord) -> Role {
    Role::Query {
        client: l.client,
        proto: l.proto,
        dns_id: l.dns_id,
    }
}

/// The role of leg `n`'s SERVER span (it has one: [`delivery`]), counting the earlier legs
/// of `tx` served at the same place from the same socket with the same DNS id (a UDP
/// resend after a truncated answer is such a leg).
fn serve_role(tx: &TransactionRecord, n: usize, l: &LegRecord) -> Role {
    let same = |o: &&LegRecord| {
        o.client == l.client
            && o.backend == l.backend
            && o.proto == l.proto
            && o.dns_id == l.dns_id
            && delivery(o).is_some()
    };
    let repeat = tx.legs.iter().take(n).filter(same).count();
    Role::Serve {
        client: l.client,
        server: l.backend,
        proto: l.proto,
        dns_id: l.dns_id,
        repeat: u16::try_from(repeat).unwrap_or(u16::MAX),
    }
}

/// The spans of one decided transaction, and its ids.
pub fn build(cfg: &SpanConfig, tx: &TransactionRecord) -> (TraceIds, Vec<PlacedSpan>) {
    let ids = trace_ids(&cfg.key, tx);
    let trace = ids.trace;
    let key = &cfg.key;
    let node = cfg.node.as_deref();
    let wall = Wall {
        offset: i128::from(tx.wall_ns) - i128::from(tx.ts_ns),
    };
    let qtype = tx.question.qtype.name();
    let local = client_is_local(tx);
    let root_id = ids::span_id(key, &trace, Role::Root);
    let mut out = Vec::with_capacity(1 + 2 * tx.legs.len());
    // The correlator marked the leg that closed a forwarding cycle, if any.
    let looped = tx.first_loop();

    // Ids first: a forwarded leg's parent is its parent leg's server span.
    // Legs of one socket and DNS id (a forwarder asking several upstreams at once) would
    // share a CLIENT span id: the later ones count their repeat (legs per transaction are
    // capped, so the scan is bounded).
    let leg_ids: Vec<LegIds> = tx
        .legs
        .iter()
        .enumerate()
        .map(|(n, l)| LegIds {
            client: ids::span_id(key, &trace, query_role(tx, n, l)),
            server: delivery(l).map(|_| ids::span_id(key, &trace, serve_role(tx, n, l))),
        })
        .collect();

    let mut root_end = tx.wall_ns;
    for (n, l) in tx.legs.iter().enumerate() {
        let Some(lid) = leg_ids.get(n) else { continue };
        let (start, end) = leg_times(l, &wall, tx.ts_ns);
        root_end = root_end.max(end);
        let parent = match l.parent.and_then(|p| leg_ids.get(p)) {
            Some(p) => Some(p.server.unwrap_or(p.client)),
            None if local => Some(root_id),
            // Another node's client: its CLIENT span is there, named by the same role.
            None => None,
        };
        let mut attributes = Vec::with_capacity(20);
        endpoint("client", l.client, &mut attributes);
        endpoint("server", l.server, &mut attributes);
        endpoint("network.peer", l.backend, &mut attributes);
        attributes.push(s("network.transport", transport(l.proto)));
        attributes.push(s("dnspath.leg_role", role_word(l.role)));
        attributes.push(i("dnspath.dns_id", i64::from(l.dns_id)));
        attributes.push(s("dnspath.qtype", &*qtype));
        attributes.push(s("dnspath.outcome", leg_outcome_word(l.outcome)));
        attributes.push(s("dnspath.join", join_word(l.join)));
        if let Some(r) = &l.rcode {
            attributes.push(s("dnspath.rcode", r.as_str()));
        }
        if l.retransmits > 0 {
            attributes.push(i("dnspath.retransmits", i64::from(l.retransmits)));
        }
        if let Some(nc) = l.node_cache {
            attributes.push(s("dnspath.node_cache", node_cache_word(nc)));
        }
        if !cfg.redact_names {
            attributes.push(s("dns.question.name", tx.question.name.as_str()));
            if !l.answers.is_empty() {
                attributes.push(strings("dns.answers", &l.answers));
            }
        }
        let mut events: Vec<Event> = l
            .hops
            .iter()
            .enumerate()
            .map(|(k, h)| hop_event(h, k, &wall, node))
            .collect();
        if let Some(d) = &l.drop {
            let mut a = vec![
                s("error.type", d.reason.as_str()),
                s("dnspath.drop.reason", d.reason.as_str()),
                s("dnspath.drop.location", d.location.as_str()),
                s("dnspath.netns", d.netns.as_ref()),
                s("dnspath.ifname", d.ifname.as_ref()),
                s("dnspath.msg", if d.response { "response" } else { "query" }),
            ];
            if let Some(n) = node {
                a.push(s("k8s.node.name", n));
            }
            // A kernel drop; named for what it was when that is known.
            let name = if d.reason == FRAGMENT_LOSS {
                "fragment loss"
            } else if l.race_drop {
                a.push(s("dnspath.race.verdict", "race-drop"));
                "conntrack race"
            } else {
                "kernel drop"
            };
            events.push(Event {
                time_unix_nano: wall.of(d.ts_ns),
                name: name.into(),
                attributes: a,
                dropped_attributes_count: 0,
            });
        }
        let mut error = leg_error(l);
        if let Some((_, lp)) = looped.filter(|(closing, _)| *closing == n) {
            events.push(loop_event(tx, lp, start, node));
            error = error.or_else(|| Some("forwarding loop".into()));
        }
        events.sort_by_key(|e| e.time_unix_nano);
        // The client span lives where its first hop is (the client's or the forwarder's pod).
        let (pod, netns) = match l.hops.first() {
            Some(h) => (&h.pod, h.netns.as_ref()),
            None => (&tx.pod, tx.client_netns.as_ref()),
        };
        if local || l.parent.is_some() {
            out.push(PlacedSpan {
                resource: resource(pod, netns, node),
                span: Span {
                    trace_id: trace.to_vec(),
                    span_id: lid.client.to_vec(),
                    parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
                    name: format!("{} {qtype}", role_word(l.role)),
                    kind: SpanKind::Client as i32,
                    start_time_unix_nano: start,
                    end_time_unix_nano: end,
                    attributes: attributes.clone(),
                    events,
                    status: status(error),
                    ..Default::default()
                },
            });
        } else {
            // Only the serving half is here: the hops go on the server span.
            let _ = events;
        }
        if let (Some(sid), Some(d)) = (lid.server, delivery(l)) {
            let s_start = wall.of(d.ts_ns);
            let s_end = l
                .hops
                .iter()
                .find(|h| h.qr && h.src == l.backend && h.ts_ns >= d.ts_ns)
                .map_or(s_start, |h| wall.of(h.ts_ns));
            let mut links = Vec::new();
            let mut server_events = Vec::new();
            // The CLIENT span this serves: here when this node sent the query; else the
            // client's node's, named by its role. That node may have sent several legs
            // from this socket with this DNS id, and this node need not see them all: it
            // names the first ([`Role::Query`]), as docs/otlp.md says.
            let mut served_for = lid.client;
            if !(local || l.parent.is_some()) {
                served_for = ids::span_id(key, &trace, first_query(l));
                server_events = l
                    .hops
                    .iter()
                    .enumerate()
                    .map(|(k, h)| hop_event(h, k, &wall, node))
                    .collect();
                // Seen near an epoch boundary: the client's node may have put it in the
                // neighbouring epoch's trace.
                if let Some(e) = ids::neighbour_epoch(tx.wall_ns) {
                    let other = ids::trace_id(key, &ids.query_key, e);
                    links.push(Link {
                        trace_id: other.to_vec(),
                        span_id: ids::span_id(key, &other, first_query(l)).to_vec(),
                        attributes: vec![s("dnspath.link", "neighbouring_epoch")],
                        ..Default::default()
                    });
                }
            }
            let mut sattrs = attributes;
            sattrs.push(s("dnspath.query_key", ids::hex(&ids.query_key)));
            out.push(PlacedSpan {
                resource: resource(&d.pod, d.netns.as_ref(), node),
                span: Span {
                    trace_id: trace.to_vec(),
                    span_id: sid.to_vec(),
                    parent_span_id: served_for.to_vec(),
                    name: format!("serve {qtype}"),
                    kind: SpanKind::Server as i32,
                    start_time_unix_nano: s_start,
                    end_time_unix_nano: s_end.max(s_start),
                    attributes: sattrs,
                    events: server_events,
                    links,
                    status: status(match l.rcode.as_deref() {
                        Some(r @ ("SERVFAIL" | "REFUSED")) => Some(r.to_string()),
                        Some(_) => None,
                        None if l.hops.iter().any(|h| h.qr && h.src == l.backend) => None,
                        None => Some("no response from the server".into()),
                    }),
                    ..Default::default()
                },
            });
        }
    }

    if local {
        let end = match tx.latency_ns {
            Some(l) => tx.wall_ns.saturating_add(l),
            None => root_end,
        };
        let mut attributes = Vec::with_capacity(16);
        endpoint("client", tx.client, &mut attributes);
        if let Some(l) = first_leg(tx) {
            endpoint("server", l.server, &mut attributes);
            attributes.push(s("network.transport", transport(l.proto)));
            attributes.push(i("dnspath.dns_id", i64::from(l.dns_id)));
        }
        attributes.push(s("dnspath.qtype", &*qtype));
        attributes.push(s("dnspath.qclass", &*tx.question.class.name()));
        attributes.push(s("dnspath.outcome", outcome_word(tx.outcome)));
        if let Some(r) = &tx.rcode {
            attributes.push(s("dnspath.rcode", r.as_str()));
        }
        attributes.push(s("dnspath.query_key", ids::hex(&ids.query_key)));
        attributes.push(i("dnspath.id_scheme", i64::from(ids::VERSION)));
        attributes.push(i(
            "dnspath.transaction",
            i64::try_from(tx.id).unwrap_or(i64::MAX),
        ));
        attributes.push(i(
            "dnspath.lookup",
            i64::try_from(tx.lookup.id).unwrap_or(i64::MAX),
        ));
        attributes.push(i(
            "dnspath.retries",
            tx.legs.iter().filter(|l| l.role == LegRole::Retry).count() as i64,
        ));
        if !cfg.redact_names {
            attributes.push(s("dns.question.name", tx.question.name.as_str()));
            if !tx.answers.is_empty() {
                attributes.push(strings("dns.answers", &tx.answers));
            }
        }
        let mut events = Vec::new();
        match &tx.summary {
            Summary::Late {
                answer_ns,
                gave_up_ns,
                reason,
                location,
                ..
            } => {
                let mut a = vec![
                    i(
                        "dnspath.answer_after_ns",
                        i64::try_from(*answer_ns).unwrap_or(i64::MAX),
                    ),
                    s("dnspath.drop.reason", reason.as_str()),
                    s("dnspath.drop.location", location.as_str()),
                ];
                if let Some(g) = gave_up_ns {
                    a.push(i(
                        "dnspath.gave_up_after_ns",
                        i64::try_from(*g).unwrap_or(i64::MAX),
                    ));
                }
                events.push(Event {
                    time_unix_nano: tx.wall_ns.saturating_add(*answer_ns),
                    name: "late answer".into(),
                    attributes: a,
                    dropped_attributes_count: 0,
                });
            }
            Summary::AnswerLost {
                location,
                netns,
                ifname,
                ..
            } => events.push(Event {
                time_unix_nano: end,
                name: "fragment loss".into(),
                attributes: vec![
                    s("dnspath.location", location.as_str()),
                    s("dnspath.netns", netns.as_str()),
                    s("dnspath.ifname", ifname.as_str()),
                ],
                dropped_attributes_count: 0,
            }),
            Summary::Answered(Answered::AfterTimeout { timeout_ns, .. }) => events.push(Event {
                time_unix_nano: tx.wall_ns.saturating_add(*timeout_ns),
                name: "retry after timeout".into(),
                attributes: vec![i(
                    "dnspath.timeout_ns",
                    i64::try_from(*timeout_ns).unwrap_or(i64::MAX),
                )],
                dropped_attributes_count: 0,
            }),
            _ => {}
        }
        events.extend(race_event(tx, &wall));
        if let Some((closing, lp)) = looped {
            let at = tx
                .legs
                .get(closing)
                .and_then(|l| l.hops.first())
                .map_or(tx.wall_ns, |h| wall.of(h.ts_ns));
            events.push(loop_event(tx, lp, at, node));
        }
        events.sort_by_key(|e| e.time_unix_nano);
        let error = tx_error(tx).or_else(|| looped.map(|_| "forwarding loop".into()));
        out.push(PlacedSpan {
            resource: resource(&tx.pod, tx.client_netns.as_ref(), node),
            span: Span {
                trace_id: trace.to_vec(),
                span_id: root_id.to_vec(),
                name: format!("DNS {qtype}"),
                kind: SpanKind::Internal as i32,
                start_time_unix_nano: tx.wall_ns,
                end_time_unix_nano: end.max(tx.wall_ns),
                attributes,
                events,
                status: status(error),
                ..Default::default()
            },
        });
    }
    (ids, out)
}

/// The hop where a leg's query was delivered to its server on this node: the leg's last
/// query hop, addressed to the backend (after DNAT), arriving in the server's namespace
/// (ingress), or handed to the server pod's veth (egress on the node's end, when only the
/// node's namespace is traced). A query whose last hop here leaves the node otherwise has
/// no server span on this node.
fn delivery(l: &LegRecord) -> Option<&HopRecord> {
    l.hops
        .iter()
        .rfind(|h| !h.qr)
        .filter(|h| h.dst == l.backend && (h.dir != Direction::Egress || h.pod.pod_veth))
}

#[cfg(test)]
#[path = "spans_tests.rs"]
mod tests;
