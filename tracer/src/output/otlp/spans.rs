//! A decided transaction as OTLP spans (docs/otlp.md, "Spans"): a root span for the client's
//! question (INTERNAL, on the client's node), a CLIENT span per leg, a SERVER span where a
//! leg's query was delivered, parented as the legs' tree; hops, drops, conntrack races,
//! forwarding loops, late answers and fragment losses as events.
//!
//! The spans are written as protobuf bytes straight from the record (`wire.rs`), with no
//! message structs in between: [`build`] decodes them back for tests and fuzzing.
use crate::detect::{loops::LoopKind, race::RaceVerdict};
use std::{fmt::Write as _, net::SocketAddr};

use opentelemetry_proto::tonic::{
    resource::v1::Resource,
    trace::v1::{span::SpanKind, status::StatusCode, Span},
};

pub use super::roles::{client_is_local, trace_ids, TraceIds};
use super::{
    ids::{self, IdKey, Role},
    resource::resource,
    roles::{delivery, first_leg, first_query, query_role, serve_role},
    wire::{self, tag, RequestBuf},
};
use crate::{
    correlate::{
        record::{Answered, LegLoop, LegOutcome, Outcome, Summary},
        LegRole, FRAGMENT_LOSS,
    },
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

/// One span and the resource (pod, namespace, node) it happened in, decoded from the bytes
/// written ([`build`]).
pub struct PlacedSpan {
    pub resource: Resource,
    pub span: Span,
}

/// The buffers [`write`] reuses from one transaction to the next.
#[derive(Default)]
pub struct Scratch {
    /// The `Resource` body of the span being written.
    resource: Vec<u8>,
    /// A leg's attributes (fields of its CLIENT and its SERVER span).
    attrs: Vec<u8>,
    /// The span's events (whole fields), and each one's time and place, sorted by time.
    events: Vec<u8>,
    order: Vec<(u64, usize, usize)>,
    /// Text made for a value (an address, a key in hex).
    text: String,
    leg_ids: Vec<LegIds>,
}

/// `v` as text in `text`.
fn shown(text: &mut String, v: impl std::fmt::Display) -> &str {
    text.clear();
    let _ = write!(text, "{v}");
    text
}

/// An address as text in `text`, as `Display` writes it; IPv4 (the common case) without
/// the formatting machinery.
fn shown_ip(text: &mut String, ip: std::net::IpAddr) -> &str {
    match ip {
        std::net::IpAddr::V4(v4) => {
            text.clear();
            push_v4(text, v4);
            text
        }
        v6 => shown(text, v6),
    }
}

/// A socket address as text in `text`, as `Display` writes it.
fn shown_addr(text: &mut String, a: SocketAddr) -> &str {
    match a {
        SocketAddr::V4(v4) => {
            text.clear();
            push_v4(text, *v4.ip());
            text.push(':');
            push_decimal(text, u32::from(v4.port()));
            text
        }
        v6 => shown(text, v6),
    }
}

fn push_v4(text: &mut String, ip: std::net::Ipv4Addr) {
    for (i, o) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        push_decimal(text, u32::from(o));
    }
}

fn push_decimal(text: &mut String, v: u32) {
    if v >= 10 {
        push_decimal(text, v / 10);
    }
    text.push(char::from(b'0' + (v % 10) as u8));
}

/// `b` in lowercase hex in `text`.
fn hex<'a>(text: &'a mut String, b: &[u8]) -> &'a str {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    text.clear();
    for x in b {
        text.push(char::from(DIGITS[usize::from(x >> 4)]));
        text.push(char::from(DIGITS[usize::from(x & 15)]));
    }
    text
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Starts an event (`Span.events`) in `sc.events`; [`event_end`] ends it.
fn event_begin(events: &mut Vec<u8>, time: u64, name: &str) -> (wire::Mark, usize, u64) {
    let start = events.len();
    let m = wire::begin(events, tag::SPAN_EVENTS);
    wire::put_fixed64(events, tag::EVENT_TIME, time);
    wire::put_bytes(events, tag::EVENT_NAME, name.as_bytes());
    (m, start, time)
}

fn event_end(sc: &mut Scratch, (m, start, time): (wire::Mark, usize, u64)) {
    wire::end(&mut sc.events, m);
    sc.order.push((time, start, sc.events.len()));
}

/// The events written so far, in order of time (stable: equal times keep their order), into
/// the span `out`; the event buffers emptied.
fn put_events(out: &mut Vec<u8>, sc: &mut Scratch) {
    sc.order.sort_by_key(|&(t, _, _)| t);
    for &(_, a, b) in &sc.order {
        out.extend_from_slice(sc.events.get(a..b).unwrap_or_default());
    }
    sc.order.clear();
    sc.events.clear();
}

/// The span's fields before its attributes.
struct Head<'a> {
    trace: &'a [u8; 16],
    id: &'a [u8; 8],
    parent: Option<&'a [u8; 8]>,
    name: [&'a str; 3],
    kind: SpanKind,
    start: u64,
    end: u64,
}

fn put_head(out: &mut Vec<u8>, h: &Head) {
    wire::put_bytes(out, tag::SPAN_TRACE_ID, h.trace);
    wire::put_bytes(out, tag::SPAN_SPAN_ID, h.id);
    if let Some(p) = h.parent {
        wire::put_bytes(out, tag::SPAN_PARENT_SPAN_ID, p);
    }
    wire::put_str_parts(out, tag::SPAN_NAME, &h.name);
    wire::put_uint(out, tag::SPAN_KIND, h.kind as i32 as u64);
    wire::put_fixed64(out, tag::SPAN_START, h.start);
    wire::put_fixed64(out, tag::SPAN_END, h.end);
}

/// Starts a span: the `Resource` of where it happened (`pod`, `netns`, `node`) into
/// `sc.resource`, its fields before the attributes into `req.spans`; where its body starts.
fn start_span(
    req: &mut RequestBuf,
    sc: &mut Scratch,
    (pod, netns, node): (&PodRef, &str, Option<&str>),
    head: &Head,
) -> usize {
    resource(&mut sc.resource, pod, netns, node);
    let at = req.span_start();
    put_head(&mut req.spans, head);
    at
}

/// Ends the span started at `at` (its attributes written since): its events, its link to
/// another trace (`link`: trace and span id), its status, and its place under its resource.
fn end_span(
    req: &mut RequestBuf,
    sc: &mut Scratch,
    at: usize,
    link: Option<([u8; 16], [u8; 8])>,
    error: Option<&str>,
) {
    let out = &mut req.spans;
    put_events(out, sc);
    if let Some((trace, span)) = link {
        let m = wire::begin(out, tag::SPAN_LINKS);
        wire::put_bytes(out, tag::LINK_TRACE_ID, &trace);
        wire::put_bytes(out, tag::LINK_SPAN_ID, &span);
        wire::kv_str(
            out,
            tag::LINK_ATTRIBUTES,
            "dnspath.link",
            "neighbouring_epoch",
        );
        wire::end(out, m);
    }
    put_status(out, error);
    req.place(at, &sc.resource);
}

/// The span's status: ERROR with `error` as its message, else UNSET (an empty message).
fn put_status(out: &mut Vec<u8>, error: Option<&str>) {
    let m = wire::begin(out, tag::SPAN_STATUS);
    if let Some(message) = error {
        wire::put_bytes(out, tag::STATUS_MESSAGE, message.as_bytes());
        wire::put_uint(out, tag::STATUS_CODE, StatusCode::Error as i32 as u64);
    }
    wire::end(out, m);
}

/// `<prefix>.address` and `<prefix>.port` attributes (`keys`) of `a`.
fn endpoint(out: &mut Vec<u8>, text: &mut String, t: u32, keys: [&str; 2], a: SocketAddr) {
    wire::kv_str(out, t, keys[0], shown_ip(text, a.ip()));
    wire::kv_int(out, t, keys[1], i64::from(a.port()));
}

const CLIENT: [&str; 2] = ["client.address", "client.port"];
const SERVER: [&str; 2] = ["server.address", "server.port"];
const PEER: [&str; 2] = ["network.peer.address", "network.peer.port"];

/// Boot-clock nanoseconds → Unix nanoseconds, by the transaction's own pair of the two.
struct Wall {
    offset: i128,
}

impl Wall {
    fn of(&self, ts_ns: u64) -> u64 {
        u64::try_from((i128::from(ts_ns) + self.offset).max(0)).unwrap_or(u64::MAX)
    }
}

fn hop_event(sc: &mut Scratch, h: &HopRecord, index: usize, wall: &Wall, node: Option<&str>) {
    const T: u32 = tag::EVENT_ATTRIBUTES;
    let e = event_begin(&mut sc.events, wall.of(h.ts_ns), "hop");
    let out = &mut sc.events;
    wire::kv_int(out, T, "dnspath.hop", clamp(index as u64));
    wire::kv_str(out, T, "dnspath.netns", &h.netns);
    wire::kv_str(out, T, "dnspath.ifname", &h.ifname);
    wire::kv_str(out, T, "dnspath.dir", h.dir.as_str());
    wire::kv_str(
        out,
        T,
        "dnspath.msg",
        if h.qr { "response" } else { "query" },
    );
    wire::kv_str(out, T, "dnspath.src", shown_addr(&mut sc.text, h.src));
    wire::kv_str(out, T, "dnspath.dst", shown_addr(&mut sc.text, h.dst));
    if let Some(p) = &h.pod_ref().pod {
        wire::kv_str(out, T, "dnspath.pod", p);
    }
    if let Some(n) = node {
        wire::kv_str(out, T, "k8s.node.name", n);
    }
    if let Some(l) = h.latency_ns {
        wire::kv_int(out, T, "dnspath.latency_ns", clamp(l));
    }
    event_end(sc, e);
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
        _ => l
            .rcode
            .as_ref()
            .filter(|r| r.is_failure())
            .map(|r| r.to_string()),
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
        Summary::Answered(_) => match &tx.rcode {
            Some(r) if r.is_failure() => Some(r.to_string()),
            _ if tx.outcome != Outcome::Answered => Some(tx.outcome.as_str().into()),
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

/// `forwarding loop`: the cycle's servers in order, each leg's forwarder and where it was
/// delivered, and the chain's length (as in the `loop` record, docs/output.md).
fn loop_event(
    sc: &mut Scratch,
    tx: &TransactionRecord,
    lp: &LegLoop,
    time: u64,
    node: Option<&str>,
) {
    const T: u32 = tag::EVENT_ATTRIBUTES;
    let legs = || lp.cycle.iter().filter_map(|&k| tx.legs.get(k));
    let e = event_begin(&mut sc.events, time, "forwarding loop");
    let (out, text) = (&mut sc.events, &mut sc.text);
    wire::kv_str(out, T, "dnspath.loop.kind", LoopKind::Cycle.as_str());
    wire::kv_strings(
        out,
        text,
        T,
        "dnspath.loop.servers",
        legs().map(|l| l.backend),
    );
    wire::kv_strings(out, text, T, "dnspath.loop.from", legs().map(|l| l.client));
    wire::kv_strings(
        out,
        text,
        T,
        "dnspath.loop.netns",
        legs().map(|l| delivery(l).map_or("", |h| &*h.netns)),
    );
    wire::kv_int(out, T, "dnspath.loop.hop_count", clamp(lp.hop_count as u64));
    if let Some(n) = node {
        wire::kv_str(out, T, "k8s.node.name", n);
    }
    event_end(sc, e);
}

/// `conntrack race` on the root: which of the client's queries the race dropped (its DNS
/// id, the backend DNAT chose), where, and when the client tried again.
fn race_event(sc: &mut Scratch, tx: &TransactionRecord, wall: &Wall) {
    const T: u32 = tag::EVENT_ATTRIBUTES;
    let roots = || tx.legs.iter().filter(|l| l.parent.is_none());
    let Some(lost) = roots().find(|l| l.race_drop) else {
        return;
    };
    let start = lost.hops.first().map_or(tx.ts_ns, |h| h.ts_ns);
    let time = wall.of(lost.drop.as_ref().map_or(start, |d| d.ts_ns));
    let e = event_begin(&mut sc.events, time, "conntrack race");
    let out = &mut sc.events;
    wire::kv_str(
        out,
        T,
        "dnspath.race.verdict",
        RaceVerdict::RaceDrop.as_str(),
    );
    wire::kv_int(out, T, "dnspath.dns_id", i64::from(lost.dns_id));
    endpoint(out, &mut sc.text, T, PEER, lost.backend);
    if let Some(d) = &lost.drop {
        wire::kv_str(out, T, "dnspath.drop.reason", &d.reason);
        wire::kv_str(out, T, "dnspath.drop.location", &d.location);
        wire::kv_str(out, T, "dnspath.netns", &d.netns);
    }
    if let Some(retry) = roots()
        .filter_map(|l| l.hops.first())
        .map(|h| h.ts_ns)
        .find(|&t| t > start)
    {
        wire::kv_int(out, T, "dnspath.retry_after_ns", clamp(retry - start));
    }
    event_end(sc, e);
}

struct LegIds {
    client: [u8; 8],
    server: Option<[u8; 8]>,
}

/// The spans of one decided transaction, written into `req` (`sc`: reused buffers); its ids
/// and how many spans.
pub fn write(
    cfg: &SpanConfig,
    tx: &TransactionRecord,
    req: &mut RequestBuf,
    sc: &mut Scratch,
) -> (TraceIds, usize) {
    const A: u32 = tag::SPAN_ATTRIBUTES;
    let ids = trace_ids(&cfg.key, tx);
    let trace = ids.trace;
    let key = &cfg.key;
    let node = cfg.node.as_deref();
    let wall = Wall {
        offset: i128::from(tx.wall_ns) - i128::from(tx.ts_ns),
    };
    let qtype_text = tx.question.qtype.name();
    let qtype: &str = &qtype_text;
    let local = client_is_local(tx);
    let root_id = ids::span_id(key, &trace, Role::Root);
    let placed_before = req.len();
    // The correlator marked the leg that closed a forwarding cycle, if any.
    let looped = tx.first_loop();

    // Ids first: a forwarded leg's parent is its parent leg's server span.
    // Legs of one socket and DNS id (a forwarder asking several upstreams at once) would
    // share a CLIENT span id: the later ones count their repeat (legs per transaction are
    // capped, so the scan is bounded).
    let mut leg_ids = std::mem::take(&mut sc.leg_ids);
    leg_ids.clear();
    leg_ids.extend(tx.legs.iter().enumerate().map(|(n, l)| LegIds {
        client: ids::span_id(key, &trace, query_role(tx, n, l)),
        server: delivery(l).map(|_| ids::span_id(key, &trace, serve_role(tx, n, l))),
    }));

    let mut root_end = tx.wall_ns;
    for (n, l) in tx.legs.iter().enumerate() {
        let Some(lid) = leg_ids.get(n) else { continue };
        let (start, end) = leg_times(l, &wall, tx.ts_ns);
        root_end = root_end.max(end);
        let parent_leg = l
            .parent
            .and_then(|p| Some((tx.legs.get(p)?, leg_ids.get(p)?)));
        let parent = match parent_leg {
            Some((_, p)) if p.server.is_some() => p.server,
            // The query forwarded is another node's client's, not seen delivered here: its
            // CLIENT span is on that node, named by its first query's role as a SERVER span
            // names it (this node need not see every leg that node sent from the socket).
            Some((pl, _)) if !local && pl.parent.is_none() => {
                Some(ids::span_id(key, &trace, first_query(pl)))
            }
            Some((_, p)) => Some(p.client),
            None if local => Some(root_id),
            // Another node's client: its CLIENT span is there, named by the same role.
            None => None,
        };
        // The attributes of the leg's CLIENT and SERVER spans.
        let a = &mut sc.attrs;
        a.clear();
        endpoint(a, &mut sc.text, A, CLIENT, l.client);
        endpoint(a, &mut sc.text, A, SERVER, l.server);
        endpoint(a, &mut sc.text, A, PEER, l.backend);
        wire::kv_str(a, A, "network.transport", l.proto.as_str());
        wire::kv_str(a, A, "dnspath.leg_role", l.role.as_str());
        wire::kv_int(a, A, "dnspath.dns_id", i64::from(l.dns_id));
        wire::kv_str(a, A, "dnspath.qtype", qtype);
        wire::kv_str(a, A, "dnspath.outcome", l.outcome.as_str());
        wire::kv_str(a, A, "dnspath.join", l.join.as_str());
        if let Some(r) = &l.rcode {
            wire::kv_str(a, A, "dnspath.rcode", r);
        }
        if l.retransmits > 0 {
            wire::kv_int(a, A, "dnspath.retransmits", i64::from(l.retransmits));
        }
        if let Some(nc) = l.node_cache {
            wire::kv_str(a, A, "dnspath.node_cache", nc.as_str());
        }
        if !cfg.redact_names {
            wire::kv_str(a, A, "dns.question.name", &tx.question.name);
            if !l.answers.is_empty() {
                wire::kv_strings(a, &mut sc.text, A, "dns.answers", l.answers.iter());
            }
        }
        // The client span lives where its first hop is (the client's or the forwarder's
        // pod); only the serving half is here when the client is another node's.
        if local || l.parent.is_some() {
            for (k, h) in l.hops.iter().enumerate() {
                hop_event(sc, h, k, &wall, node);
            }
            if let Some(d) = &l.drop {
                const T: u32 = tag::EVENT_ATTRIBUTES;
                // A kernel drop; named for what it was when that is known.
                let name = if d.reason == FRAGMENT_LOSS {
                    "fragment loss"
                } else if l.race_drop {
                    "conntrack race"
                } else {
                    "kernel drop"
                };
                let e = event_begin(&mut sc.events, wall.of(d.ts_ns), name);
                let out = &mut sc.events;
                wire::kv_str(out, T, "error.type", &d.reason);
                wire::kv_str(out, T, "dnspath.drop.reason", &d.reason);
                wire::kv_str(out, T, "dnspath.drop.location", &d.location);
                wire::kv_str(out, T, "dnspath.netns", &d.netns);
                wire::kv_str(out, T, "dnspath.ifname", &d.ifname);
                let msg = if d.response { "response" } else { "query" };
                wire::kv_str(out, T, "dnspath.msg", msg);
                if let Some(n) = node {
                    wire::kv_str(out, T, "k8s.node.name", n);
                }
                if d.reason != FRAGMENT_LOSS && l.race_drop {
                    wire::kv_str(
                        out,
                        T,
                        "dnspath.race.verdict",
                        RaceVerdict::RaceDrop.as_str(),
                    );
                }
                event_end(sc, e);
            }
            let mut error = leg_error(l);
            if let Some((_, lp)) = looped.filter(|(closing, _)| *closing == n) {
                loop_event(sc, tx, lp, start, node);
                error = error.or_else(|| Some("forwarding loop".into()));
            }
            let (pod, netns) = match l.hops.first() {
                Some(h) => (h.pod_ref(), h.netns.as_ref()),
                None => (&tx.pod, tx.client_netns.as_ref()),
            };
            let head = Head {
                trace: &trace,
                id: &lid.client,
                parent: parent.as_ref(),
                name: [l.role.as_str(), " ", qtype],
                kind: SpanKind::Client,
                start,
                end,
            };
            let at = start_span(req, sc, (pod, netns, node), &head);
            req.spans.extend_from_slice(&sc.attrs);
            end_span(req, sc, at, None, error.as_deref());
        }
        if let (Some(sid), Some(d)) = (lid.server, delivery(l)) {
            let s_start = wall.of(d.ts_ns);
            let s_end = l
                .hops
                .iter()
                .find(|h| h.qr && h.src == l.backend && h.ts_ns >= d.ts_ns)
                .map_or(s_start, |h| wall.of(h.ts_ns));
            // The CLIENT span this serves: here when this node sent the query; else the
            // client's node's, named by its role. That node may have sent several legs
            // from this socket with this DNS id, and this node need not see them all: it
            // names the first ([`Role::Query`]), as docs/otlp.md says.
            let mut served_for = lid.client;
            // Seen near an epoch boundary: the client's node may have put it in the
            // neighbouring epoch's trace.
            let mut link = None;
            if !(local || l.parent.is_some()) {
                served_for = ids::span_id(key, &trace, first_query(l));
                for (k, h) in l.hops.iter().enumerate() {
                    hop_event(sc, h, k, &wall, node);
                }
                if let Some(e) = ids::neighbour_epoch(tx.wall_ns) {
                    let other = ids::trace_id(key, &ids.query_key, e);
                    link = Some((other, ids::span_id(key, &other, first_query(l))));
                }
            }
            let head = Head {
                trace: &trace,
                id: &sid,
                parent: Some(&served_for),
                name: ["serve ", qtype, ""],
                kind: SpanKind::Server,
                start: s_start,
                end: s_end.max(s_start),
            };
            let at = start_span(req, sc, (d.pod_ref(), d.netns.as_ref(), node), &head);
            req.spans.extend_from_slice(&sc.attrs);
            let qk = hex(&mut sc.text, &ids.query_key);
            wire::kv_str(&mut req.spans, A, "dnspath.query_key", qk);
            let error = match &l.rcode {
                Some(r) if r.is_failure() => Some(&**r),
                Some(_) => None,
                None if l.hops.iter().any(|h| h.qr && h.src == l.backend) => None,
                None => Some("no response from the server"),
            };
            end_span(req, sc, at, link, error);
        }
    }
    sc.leg_ids = leg_ids;

    if local {
        let end = match tx.latency_ns {
            Some(l) => tx.wall_ns.saturating_add(l),
            None => root_end,
        };
        let events = &mut sc.events;
        match &tx.summary {
            Summary::Late {
                answer_ns,
                gave_up_ns,
                reason,
                location,
                ..
            } => {
                const T: u32 = tag::EVENT_ATTRIBUTES;
                let time = tx.wall_ns.saturating_add(*answer_ns);
                let e = event_begin(events, time, "late answer");
                wire::kv_int(events, T, "dnspath.answer_after_ns", clamp(*answer_ns));
                wire::kv_str(events, T, "dnspath.drop.reason", reason);
                wire::kv_str(events, T, "dnspath.drop.location", location);
                if let Some(g) = gave_up_ns {
                    wire::kv_int(events, T, "dnspath.gave_up_after_ns", clamp(*g));
                }
                event_end(sc, e);
            }
            Summary::AnswerLost {
                location,
                netns,
                ifname,
                ..
            } => {
                const T: u32 = tag::EVENT_ATTRIBUTES;
                let e = event_begin(events, end, "fragment loss");
                wire::kv_str(events, T, "dnspath.location", location);
                wire::kv_str(events, T, "dnspath.netns", netns);
                wire::kv_str(events, T, "dnspath.ifname", ifname);
                event_end(sc, e);
            }
            Summary::Answered(Answered::AfterTimeout { timeout_ns, .. }) => {
                const T: u32 = tag::EVENT_ATTRIBUTES;
                let time = tx.wall_ns.saturating_add(*timeout_ns);
                let e = event_begin(events, time, "retry after timeout");
                wire::kv_int(events, T, "dnspath.timeout_ns", clamp(*timeout_ns));
                event_end(sc, e);
            }
            _ => {}
        }
        race_event(sc, tx, &wall);
        if let Some((closing, lp)) = looped {
            let at = tx
                .legs
                .get(closing)
                .and_then(|l| l.hops.first())
                .map_or(tx.wall_ns, |h| wall.of(h.ts_ns));
            loop_event(sc, tx, lp, at, node);
        }
        let error = tx_error(tx).or_else(|| looped.map(|_| "forwarding loop".into()));
        let head = Head {
            trace: &trace,
            id: &root_id,
            parent: None,
            name: ["DNS ", qtype, ""],
            kind: SpanKind::Internal,
            start: tx.wall_ns,
            end: end.max(tx.wall_ns),
        };
        let at = start_span(req, sc, (&tx.pod, tx.client_netns.as_ref(), node), &head);
        let out = &mut req.spans;
        let text = &mut sc.text;
        endpoint(out, text, A, CLIENT, tx.client);
        if let Some(l) = first_leg(tx) {
            endpoint(out, text, A, SERVER, l.server);
            wire::kv_str(out, A, "network.transport", l.proto.as_str());
            wire::kv_int(out, A, "dnspath.dns_id", i64::from(l.dns_id));
        }
        wire::kv_str(out, A, "dnspath.qtype", qtype);
        wire::kv_str(out, A, "dnspath.qclass", &tx.question.class.name());
        wire::kv_str(out, A, "dnspath.outcome", tx.outcome.as_str());
        if let Some(r) = &tx.rcode {
            wire::kv_str(out, A, "dnspath.rcode", r);
        }
        wire::kv_str(out, A, "dnspath.query_key", hex(text, &ids.query_key));
        wire::kv_int(out, A, "dnspath.id_scheme", i64::from(ids::VERSION));
        wire::kv_int(out, A, "dnspath.transaction", clamp(tx.id));
        wire::kv_int(out, A, "dnspath.lookup", clamp(tx.lookup.id));
        let retries = tx.legs.iter().filter(|l| l.role == LegRole::Retry).count();
        wire::kv_int(out, A, "dnspath.retries", clamp(retries as u64));
        if !cfg.redact_names {
            wire::kv_str(out, A, "dns.question.name", &tx.question.name);
            if !tx.answers.is_empty() {
                wire::kv_strings(out, text, A, "dns.answers", tx.answers.iter());
            }
        }
        end_span(req, sc, at, None, error.as_deref());
    }
    (ids, req.len() - placed_before)
}

/// The spans of one decided transaction, decoded from the bytes [`write`] makes, and its
/// ids (for tests and fuzzing; a body prost cannot decode is an empty message).
pub fn build(cfg: &SpanConfig, tx: &TransactionRecord) -> (TraceIds, Vec<PlacedSpan>) {
    use prost::Message;
    let mut req = RequestBuf::default();
    let (ids, _) = write(cfg, tx, &mut req, &mut Scratch::default());
    let placed = req
        .placed()
        .map(|(r, s)| {
            let p = PlacedSpan {
                resource: Resource::decode(r).unwrap_or_default(),
                span: Span::decode(s).unwrap_or_default(),
            };
            // Every test's spans are written as prost writes them.
            #[cfg(test)]
            assert_eq!(
                (p.resource.encode_to_vec(), p.span.encode_to_vec()),
                (r.to_vec(), s.to_vec())
            );
            p
        })
        .collect();
    (ids, placed)
}

#[cfg(test)]
#[path = "spans_tests.rs"]
mod tests;
