//! The fuzz targets' entry into the pipeline (fuzz/, `cargo xtask fuzz`): not an API, hidden
//! from the docs, changed with the targets.
//!
//! [`Harness`] drives the live pipeline (decode → correlate → detect, storm shedding on)
//! with tables small enough for a fuzz input of a few hundred events to reach every bound,
//! and checks after every event what must hold whatever the input:
//! - every packet is accounted for exactly once (the decode stage's equation of
//!   [`DecodeStats::tcp_messages`](crate::decode::record::DecodeStats::tcp_messages), with
//!   the fragments held, merged or given up on), and every drop event is counted (watched
//!   or not);
//! - every table of the decode stage (IP fragment and TCP reassembly, questions counted
//!   only), of the correlate stage and of the detectors (loops, races) is within its bound
//!   ([`Correlator::check_bounds`](crate::correlate::Correlator)), and every transaction
//!   within its legs and hops per leg;
//! - a transaction is reported once, and a leg in one transaction only (so never both
//!   answered and dropped); an answered transaction has an answered root leg, an answered
//!   leg an rcode, an unanswered or pending one neither answer nor drop;
//! - with [`Harness::with_otlp`], every transaction's OTLP spans and request hold
//!   [`check_otlp`]'s invariants, names shown and redacted.
use std::{
    collections::HashSet,
    sync::{Arc, RwLock},
};

use crate::output::record::Detected;
use crate::{
    correlate::{
        record::{LegOutcome, Outcome, Summary, TransactionRecord},
        CorrelateConfig,
    },
    decode::{decoder::Decoder, frag::FragLimits, tcp::TcpLimits},
    event::SourceEvent,
    kallsyms::Kallsyms,
    names::Names,
    output::{
        otlp::{
            export,
            ids::{self, Role},
            spans::{self, PlacedSpan},
            SpanConfig,
        },
        record::Record,
    },
    pipeline::{Pipeline, PipelineConfig},
    time::Clock,
};
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::{any_value::Value, AnyValue},
    trace::v1::span::SpanKind,
};
use prost::Message;

/// The harness's bounds (the defaults are thousands of times larger).
pub const MAX_LEGS: usize = 24;
pub const MAX_CT_ENTRIES: usize = 16;
pub const MAX_HOPS_PER_LEG: usize = 6;
pub const MAX_LEGS_PER_TRANSACTION: usize = 5;
/// Small enough that a few legs of full hops reach it.
pub const MAX_LEG_BYTES: usize = 32 << 10;
/// The reassemblers' (decode/tcp, decode/frag).
pub const MAX_TCP_FLOWS: usize = 8;
pub const MAX_DATAGRAMS: usize = 8;
pub const MAX_FRAGMENT_BYTES: usize = 8 << 10;
pub const MAX_FRAGMENTS: usize = 8;

/// The pipeline under test, what it was given, and what it reported.
pub struct Harness {
    pipeline: Pipeline,
    out: Vec<Record>,
    packets: u64,
    drops: u64,
    transactions: HashSet<u64>,
    legs: HashSet<u64>,
    /// Records of each kind seen (packet, drop, transaction, fragment loss, then each
    /// detection in [`Detected::NAMES`] order).
    pub seen: [u64; 4 + Detected::NAMES.len()],
    /// Spans made of every transaction and checked ([`check_otlp`]).
    otlp: Option<SpanConfig>,
    /// Spans checked.
    pub spans: u64,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        let clock = Clock::Epoch;
        // Namespaces 1 (the node's), 2 and 3 are watched, two interfaces each: drops
        // elsewhere are only counted (`drops_unwatched`), as live.
        let mut known = Names::default();
        for (cookie, ns) in [(1, "node"), (2, "pod-a"), (3, "pod-b")] {
            known.learn(cookie, ns, 1, "eth0");
            known.learn(cookie, ns, 2, "veth1");
        }
        let names = Arc::new(RwLock::new(known));
        let mut decoder = Decoder::new(clock, names, Kallsyms::default(), Default::default());
        decoder.set_limits(
            TcpLimits {
                max_flows: MAX_TCP_FLOWS,
                ..Default::default()
            },
            FragLimits {
                max_datagrams: MAX_DATAGRAMS,
                max_bytes: MAX_FRAGMENT_BYTES,
                max_fragments: MAX_FRAGMENTS,
                ..Default::default()
            },
        );
        let pipeline = Pipeline::with_bounds(
            decoder,
            PipelineConfig {
                transactions: true,
                timeout_ns: 5_000_000_000,
                shed_loops: true,
                node_netns: Some(1),
            },
            CorrelateConfig {
                max_legs: MAX_LEGS,
                max_leg_bytes: MAX_LEG_BYTES,
                max_ct_entries: MAX_CT_ENTRIES,
                max_hops_per_leg: MAX_HOPS_PER_LEG,
                max_legs_per_transaction: MAX_LEGS_PER_TRANSACTION,
                ..Default::default()
            },
            clock,
        );
        Self {
            pipeline,
            out: Vec::new(),
            packets: 0,
            drops: 0,
            transactions: HashSet::new(),
            legs: HashSet::new(),
            seen: [0; 4 + Detected::NAMES.len()],
            otlp: None,
            spans: 0,
        }
    }

    /// Every transaction reported also goes through the OTLP encoder ([`check_otlp`]), with
    /// `cfg` and with names redacted.
    pub fn with_otlp(cfg: SpanConfig) -> Self {
        Self {
            otlp: Some(cfg),
            ..Self::new()
        }
    }

    /// One source event through the pipeline, then the checks.
    pub fn push(&mut self, ev: SourceEvent) -> Result<(), String> {
        match ev {
            SourceEvent::Packet(_) => self.packets += 1,
            SourceEvent::Drop(_) => self.drops += 1,
            _ => {}
        }
        self.pipeline.push(ev, &mut self.out);
        self.check(false)
    }

    /// Time passed (`now_ns` on the events' clock), then the checks.
    pub fn tick(&mut self, now_ns: u64) -> Result<(), String> {
        self.pipeline.tick(now_ns, &mut self.out);
        self.check(false)
    }

    /// The input ended: everything pending comes out, then the checks (no fragment held).
    pub fn finish(&mut self) -> Result<(), String> {
        while self.pipeline.finish(0, &mut self.out) {}
        self.check(true)
    }

    fn check(&mut self, finished: bool) -> Result<(), String> {
        self.pipeline.check_bounds()?;
        let d = self.pipeline.stats().decode;
        let accounted =
            i128::from(d.decoded) + i128::from(d.capture_truncated) + i128::from(d.malformed)
                - i128::from(d.tcp_messages)
                + i128::from(d.tcp_control)
                + i128::from(d.tcp_data)
                + i128::from(d.other)
                + i128::from(d.summarised)
                + i128::from(d.fragments_merged)
                + i128::from(d.fragments_incomplete)
                + i128::from(d.fragments_pending);
        if d.packets != self.packets || accounted != i128::from(self.packets) {
            return Err(format!(
                "{} packets pushed, {} counted, {accounted} accounted for: {d:?}",
                self.packets, d.packets
            ));
        }
        if d.drops + d.drops_unwatched != self.drops {
            return Err(format!(
                "{} drops pushed, {} + {} unwatched counted",
                self.drops, d.drops, d.drops_unwatched
            ));
        }
        if finished && d.fragments_pending != 0 {
            return Err(format!("{} fragments held at the end", d.fragments_pending));
        }
        for r in std::mem::take(&mut self.out) {
            let kind = match &r {
                Record::Packet(_) => 0,
                Record::Drop(_) => 1,
                Record::Transaction(t) => {
                    self.transaction(t)?;
                    2
                }
                Record::FragmentLoss(_) => 3,
                Record::Detected(d) => 4 + d.index(),
                Record::Stats(_) | Record::Summary(_) => continue,
            };
            if let Some(n) = self.seen.get_mut(kind) {
                *n += 1;
            }
        }
        Ok(())
    }

    fn transaction(&mut self, t: &TransactionRecord) -> Result<(), String> {
        let id = t.id;
        if !self.transactions.insert(id) {
            return Err(format!("transaction {id} reported twice"));
        }
        if t.legs.is_empty() || t.legs.len() > MAX_LEGS_PER_TRANSACTION {
            return Err(format!("transaction {id} with {} legs", t.legs.len()));
        }
        for l in &t.legs {
            if !self.legs.insert(l.id) {
                return Err(format!("leg {} reported again in transaction {id}", l.id));
            }
            if l.hops.is_empty() || l.hops.len() > MAX_HOPS_PER_LEG {
                return Err(format!("leg {} with {} hops", l.id, l.hops.len()));
            }
            let fine = match l.outcome {
                LegOutcome::Answered | LegOutcome::Truncated => l.rcode.is_some(),
                LegOutcome::Pending | LegOutcome::Unanswered => {
                    l.rcode.is_none() && l.drop.is_none()
                }
                LegOutcome::Dropped | LegOutcome::Late => true,
            };
            if !fine {
                return Err(format!(
                    "leg {} {:?} with rcode {:?} and drop {:?}",
                    l.id, l.outcome, l.rcode, l.drop
                ));
            }
        }
        let answered_root = t.legs.iter().any(|l| {
            l.parent.is_none() && matches!(l.outcome, LegOutcome::Answered | LegOutcome::Truncated)
        });
        let fine = match (&t.outcome, &t.summary) {
            (Outcome::Answered, Summary::Answered(_)) => answered_root && t.rcode.is_some(),
            (Outcome::Dropped, Summary::Dropped { .. } | Summary::AnswerLost { .. }) => true,
            (Outcome::Late, Summary::Late { .. }) => t.rcode.is_some(),
            (Outcome::Pending, Summary::Pending) => t.rcode.is_none(),
            (Outcome::Unanswered, Summary::Unanswered { .. }) => t.rcode.is_none(),
            _ => false,
        };
        if !fine {
            return Err(format!(
                "transaction {id}: {:?} with {:?}, rcode {:?}",
                t.outcome, t.summary, t.rcode
            ));
        }
        if let Some(cfg) = &self.otlp {
            self.spans += check_otlp(cfg, t)?;
            if !cfg.redact_names {
                let redacted = SpanConfig {
                    redact_names: true,
                    ..cfg.clone()
                };
                self.spans += check_otlp(&redacted, t)?;
            }
        }
        Ok(())
    }
}

/// The OTLP encoder's invariants on one decided transaction (the `otlp` fuzz target); the
/// number of spans made. Every span is in the transaction's trace with a non-zero id of its
/// own; its parent is a span of the same transaction, or — a SERVER span of a query from
/// another node's client, or a forwarder's CLIENT span when that query's delivery was not
/// seen here — that client's CLIENT span, named by its role (docs/otlp.md, "Another node's
/// client"); only the root, written on the client's node only, has none;
/// with `redact_names` no string of any span, event or resource holds the question's name
/// or an answer, nor do the encoded bytes hold the name; the request encodes and decodes
/// back to itself.
pub fn check_otlp(cfg: &SpanConfig, tx: &TransactionRecord) -> Result<u64, String> {
    let (ids, placed) = spans::build(cfg, tx);
    check_spans(cfg, tx, &ids, &placed)?;
    let id = tx.id;
    let n = placed.len() as u64;
    let (bytes, count) = export::request(cfg, std::iter::once(tx));
    if count != n {
        return Err(format!(
            "transaction {id}: {n} spans, {count} in the request"
        ));
    }
    // Written as prost writes it: it decodes, to as many spans, and encodes back the same.
    match ExportTraceServiceRequest::decode(bytes.as_slice()) {
        Ok(back) if back.encode_to_vec() != bytes => Err(format!(
            "transaction {id}: the request is not written as prost writes it"
        )),
        Ok(back)
            if back
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len() as u64)
                .sum::<u64>()
                != n =>
        {
            Err(format!(
                "transaction {id}: the request decodes to other spans"
            ))
        }
        Ok(_) => Ok(n),
        Err(e) => Err(format!(
            "transaction {id}: the request does not decode: {e}"
        )),
    }
}

/// [`check_otlp`]'s checks of the spans themselves.
fn check_spans(
    cfg: &SpanConfig,
    tx: &TransactionRecord,
    ids: &spans::TraceIds,
    placed: &[PlacedSpan],
) -> Result<(), String> {
    let id = tx.id;
    let local = spans::client_is_local(tx);
    if ids.trace == [0; 16] {
        return Err(format!("transaction {id}: trace id zero"));
    }
    let own: HashSet<&[u8]> = placed.iter().map(|p| p.span.span_id.as_slice()).collect();
    if own.len() != placed.len() {
        return Err(format!(
            "transaction {id}: {} spans, {} span ids",
            placed.len(),
            own.len()
        ));
    }
    // The CLIENT spans of another node's client: what its queries' SERVER spans name.
    let remote: HashSet<[u8; 8]> = tx
        .legs
        .iter()
        .filter(|l| !local && l.parent.is_none())
        .map(|l| {
            ids::span_id(
                &cfg.key,
                &ids.trace,
                Role::Query {
                    client: l.client,
                    proto: l.proto.number(),
                    dns_id: l.dns_id,
                },
            )
        })
        .collect();
    let mut roots = 0;
    for p in placed {
        let s = &p.span;
        let what = format!("transaction {id}: span {:?}", s.name);
        if s.trace_id != ids.trace {
            return Err(format!("{what} in another trace"));
        }
        if s.span_id.len() != 8 || s.span_id.iter().all(|b| *b == 0) {
            return Err(format!("{what}: span id {:?}", s.span_id));
        }
        if s.parent_span_id.is_empty() {
            roots += 1;
            if s.kind != SpanKind::Internal as i32 {
                return Err(format!("{what} (kind {}) without a parent", s.kind));
            }
        } else if !own.contains(s.parent_span_id.as_slice())
            && !<[u8; 8]>::try_from(s.parent_span_id.as_slice()).is_ok_and(|p| remote.contains(&p))
        {
            return Err(format!(
                "{what}: parent {} neither in the transaction nor a remote client's",
                ids::hex(&s.parent_span_id)
            ));
        }
        if s.end_time_unix_nano < s.start_time_unix_nano {
            return Err(format!("{what} ends before it starts"));
        }
    }
    if roots != usize::from(local) {
        return Err(format!(
            "transaction {id}: {roots} spans without a parent, client local: {local}"
        ));
    }
    if cfg.redact_names {
        redacted(tx, placed)?;
    }
    Ok(())
}

/// No name or answer attribute in `placed`, and no string of it (span names, values, status
/// messages) holding the name or an answer, nor the name in its bytes. Short strings can turn
/// up by chance (a name `udp`, in ids): the search is for eight bytes or more.
fn redacted(tx: &TransactionRecord, placed: &[PlacedSpan]) -> Result<(), String> {
    let name = tx.question.name.trim_end_matches('.');
    let secrets: Vec<&str> = std::iter::once(name)
        .chain(tx.answers.iter().map(String::as_str))
        .chain(
            tx.legs
                .iter()
                .flat_map(|l| l.answers.iter().map(String::as_str)),
        )
        .filter(|s| s.len() >= 8)
        .collect();
    let mut texts: Vec<&str> = Vec::new();
    for p in placed {
        texts.push(&p.span.name);
        let attrs = p
            .span
            .attributes
            .iter()
            .chain(p.span.events.iter().flat_map(|e| e.attributes.iter()))
            .chain(p.span.links.iter().flat_map(|l| l.attributes.iter()))
            .chain(p.resource.attributes.iter());
        for kv in attrs {
            if kv.key == "dns.question.name" || kv.key == "dns.answers" {
                return Err(format!(
                    "transaction {}: redacted span {:?} has {}",
                    tx.id, p.span.name, kv.key
                ));
            }
            strings_of(kv.value.as_ref(), &mut texts);
        }
        texts.extend(p.span.events.iter().map(|e| e.name.as_str()));
        if let Some(st) = &p.span.status {
            texts.push(&st.message);
        }
    }
    for t in texts {
        if let Some(s) = secrets.iter().find(|s| t.contains(**s)) {
            return Err(format!(
                "transaction {}: redacted spans hold {s:?} in {t:?}",
                tx.id
            ));
        }
    }
    if name.len() >= 8 {
        for p in placed {
            let bytes = p.span.encode_to_vec();
            if bytes.windows(name.len()).any(|w| w == name.as_bytes()) {
                return Err(format!(
                    "transaction {}: redacted span {:?} holds the name's bytes",
                    tx.id, p.span.name
                ));
            }
        }
    }
    Ok(())
}

fn strings_of<'a>(v: Option<&'a AnyValue>, out: &mut Vec<&'a str>) {
    match v.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => out.push(s),
        Some(Value::ArrayValue(a)) => {
            for x in &a.values {
                strings_of(Some(x), out);
            }
        }
        Some(Value::KvlistValue(l)) => {
            for kv in &l.values {
                out.push(&kv.key);
                strings_of(kv.value.as_ref(), out);
            }
        }
        Some(Value::BytesValue(b)) => {
            if let Ok(s) = std::str::from_utf8(b) {
                out.push(s);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{CapturedPacket, Direction, ObservationPoint};

    /// IPv4/UDP 10.0.0.1:40000 ⇄ 10.0.0.2:53, `a.` A, id 7; the response with one answer.
    fn packet(ts_ns: u64, response: bool) -> SourceEvent {
        let mut dns = vec![
            0, 7, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 0, 0, 1, 0, 1,
        ];
        if response {
            dns[2] = 0x81;
            dns[3] = 0x80;
            dns[7] = 1;
            dns.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 1, 2, 3]);
        }
        let (c, s) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let (src, dst, sport, dport) = if response {
            (s, c, 53u16, 40_000u16)
        } else {
            (c, s, 40_000, 53)
        };
        let mut v = vec![0x45, 0];
        v.extend_from_slice(&((28 + dns.len()) as u16).to_be_bytes());
        v.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
        v.extend_from_slice(&src);
        v.extend_from_slice(&dst);
        v.extend_from_slice(&sport.to_be_bytes());
        v.extend_from_slice(&dport.to_be_bytes());
        v.extend_from_slice(&((8 + dns.len()) as u16).to_be_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&dns);
        SourceEvent::Packet(CapturedPacket {
            ts_ns,
            cpu: Some(0),
            at: ObservationPoint {
                netns: 2,
                ifindex: 1,
                dir: Direction::Egress,
            },
            vlan: None,
            orig_len: v.len() as u32,
            data: v.into(),
        })
    }

    #[test]
    fn a_query_and_its_answer_make_one_answered_transaction_and_pass() {
        let mut h = Harness::new();
        h.push(packet(1_000_000_000, false)).unwrap();
        h.push(packet(1_001_000_000, true)).unwrap();
        h.tick(3_000_000_000).unwrap();
        h.finish().unwrap();
        assert_eq!(h.seen[2], 1, "one transaction: {:?}", h.seen);
        assert_eq!(h.seen[0], 2, "two packet records");
    }

    /// Through the OTLP encoder too: a root, a CLIENT span under it, a SERVER span (the
    /// query is delivered in namespace 2, where the client is seen leaving: not delivered).
    #[test]
    fn with_otlp_every_transaction_becomes_checked_spans() {
        let mut h = Harness::with_otlp(SpanConfig::default());
        h.push(packet(1_000_000_000, false)).unwrap();
        h.push(packet(1_001_000_000, true)).unwrap();
        h.finish().unwrap();
        assert_eq!(h.seen[2], 1);
        // Root and CLIENT span, names shown and redacted.
        assert_eq!(h.spans, 4, "spans checked");
    }

    /// The OTLP checks fire: a span whose parent is not there, a second root, a name left
    /// in redacted spans.
    #[test]
    fn the_otlp_checks_fire_on_what_must_not_happen() {
        let mut h = Harness::new();
        let mut out = Vec::new();
        h.pipeline.push(packet(1_000_000_000, false), &mut out);
        h.pipeline.push(packet(1_001_000_000, true), &mut out);
        while h.pipeline.finish(0, &mut out) {}
        let mut t = out
            .iter()
            .find_map(|r| match r {
                Record::Transaction(t) => Some((**t).clone()),
                _ => None,
            })
            .expect("a transaction");
        let cfg = SpanConfig::default();
        assert_eq!(check_otlp(&cfg, &t), Ok(2));
        let (ids, placed) = spans::build(&cfg, &t);

        let orphan: Vec<PlacedSpan> = placed
            .iter()
            .filter(|p| !p.span.parent_span_id.is_empty())
            .map(|p| PlacedSpan {
                resource: p.resource.clone(),
                span: p.span.clone(),
            })
            .collect();
        let e = check_spans(&cfg, &t, &ids, &orphan).unwrap_err();
        assert!(e.contains("neither in the transaction"), "{e}");

        let mut two = placed
            .iter()
            .map(|p| PlacedSpan {
                resource: p.resource.clone(),
                span: p.span.clone(),
            })
            .collect::<Vec<_>>();
        two[0].span.parent_span_id.clear();
        two[1].span.parent_span_id.clear();
        let e = check_spans(&cfg, &t, &ids, &two).unwrap_err();
        assert!(e.contains("without a parent"), "{e}");

        // Redacted spans with the name of the open ones: a leak, caught by value and bytes.
        let redact = SpanConfig {
            redact_names: true,
            ..cfg.clone()
        };
        t.answers = vec!["A 10.1.2.3".into()];
        assert!(check_otlp(&redact, &t).is_ok());
        let (_, open) = spans::build(&cfg, &t);
        let e = check_spans(&redact, &t, &ids, &open).unwrap_err();
        assert!(e.contains("dns.question.name"), "{e}");
        let mut hidden = open;
        for p in &mut hidden {
            for kv in &mut p.span.attributes {
                if kv.key.starts_with("dns.") {
                    kv.key = "x".into();
                }
            }
        }
        let e = check_spans(&redact, &t, &ids, &hidden).unwrap_err();
        assert!(e.contains("redacted spans hold \"A 10.1.2.3\""), "{e}");
    }

    /// The checks fire: a packet not accounted for, and a transaction reported twice.
    #[test]
    fn the_checks_fire_on_what_must_not_happen() {
        let mut h = Harness::new();
        h.push(packet(1_000_000_000, false)).unwrap();
        h.packets += 1;
        let e = h.tick(1_100_000_000).unwrap_err();
        assert!(e.contains("2 packets pushed, 1 counted"), "{e}");

        let mut h = Harness::new();
        let mut out = Vec::new();
        h.pipeline.push(packet(1_000_000_000, false), &mut out);
        h.pipeline.push(packet(1_001_000_000, true), &mut out);
        while h.pipeline.finish(0, &mut out) {}
        let t = out
            .iter()
            .find_map(|r| match r {
                Record::Transaction(t) => Some(t),
                _ => None,
            })
            .expect("a transaction");
        h.transaction(t).unwrap();
        let e = h.transaction(t).unwrap_err();
        assert!(e.contains("reported twice"), "{e}");
        let mut other = (**t).clone();
        other.id += 1;
        let e = h.transaction(&other).unwrap_err();
        assert!(e.contains("reported again"), "{e}");
    }
}
