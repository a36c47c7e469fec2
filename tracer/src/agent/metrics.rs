//! Prometheus metrics of the agent (OpenMetrics text), counted from the pipeline's records.
//!
//! Every label takes its value from a fixed set chosen here (`&'static str`), or — for the
//! kernel's drop reasons, an enum of the running kernel — from a capped set: no pod, address,
//! port or query name ever becomes a label, so the number of series is bounded whatever the
//! traffic. Names follow CoreDNS (`coredns_dns_requests_total`, `…_request_duration_seconds`)
//! and Hubble (`hubble_dns_queries_total`): `dnspath_<subsystem>_<what>_<unit>`. The table is
//! in docs/metrics.md.
use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::{Mutex, MutexGuard},
};

use prometheus_client::{
    encoding::{prometheus_text, text::encode, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use super::events::Events;
use crate::{
    correlate::{
        loops::{LoopKind, LoopRecord, LoopState},
        race::{RaceRecord, RaceVerdict},
        LegRole,
    },
    output::record::{DropRecord, LegRecord, PacketRecord, Record, StatsRecord, TransactionRecord},
};

/// Latency buckets (seconds): 100 µs … 1 ms resolve hops inside a node (a veth, a DNAT, a
/// node-local cache); 4.5 and 5.5 sit either side of the resolver's 5 s retry (glibc
/// `timeout:5`), so a lookup that waited out one timeout lands above 4.5.
pub const LATENCY_BUCKETS: [f64; 17] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    4.5, 5.5, 10.0,
];

/// Query types with a label of their own; every other type is `other`.
pub const QTYPES: [&str; 13] = [
    "A", "AAAA", "PTR", "SRV", "CNAME", "MX", "TXT", "NS", "SOA", "HTTPS", "SVCB", "ANY", "HINFO",
];

/// Response codes with a label of their own (IANA mnemonics, as `dns.rcode` spells them);
/// every other code is `other`.
pub const RCODES: [&str; 13] = [
    "NOERROR",
    "FORMERR",
    "SERVFAIL",
    "NXDOMAIN",
    "NOTIMP",
    "REFUSED",
    "YXDOMAIN",
    "YXRRSET",
    "NXRRSET",
    "NOTAUTH",
    "NOTZONE",
    "BADVERS",
    "BADCOOKIE",
];

/// Distinct kernel drop reasons kept as labels (`enum skb_drop_reason` has ~120 names on
/// 6.18); beyond this, or for a name that is not an enum identifier, `other`.
pub const MAX_DROP_REASONS: usize = 256;
/// Loop ids remembered to keep `dnspath_forwarding_loops_active` right (the correlator keeps
/// at most 1 024 loop reports).
const MAX_ACTIVE_LOOPS: usize = 4096;
/// Search lookups whose latest step was NXDOMAIN, remembered until their next step.
const MAX_SEARCH_LOOKUPS: usize = 4096;
/// Retries after a kernel drop, held until the race record of the same batch says whether
/// the drop was a conntrack race.
const MAX_PENDING_DROPPED: usize = 256;

pub fn qtype_label(qtype: &str) -> &'static str {
    if qtype == "*" {
        return "ANY";
    }
    QTYPES
        .iter()
        .find(|t| t.eq_ignore_ascii_case(qtype))
        .copied()
        .unwrap_or("other")
}

pub fn rcode_label(rcode: &str) -> &'static str {
    RCODES
        .iter()
        .find(|r| r.eq_ignore_ascii_case(rcode))
        .copied()
        .unwrap_or("other")
}

fn proto_label(proto: &str) -> &'static str {
    match proto {
        "tcp" => "tcp",
        _ => "udp",
    }
}

/// Where a leg's query went, from what its record says:
/// - `stub`: a loopback server (127.0.0.0/8, ::1): a node-local or in-pod stub;
/// - `upstream`: a server's own query (a forward: CoreDNS to its upstream);
/// - `service`: a client's query DNAT'd on its way (sent to a Service ClusterIP);
/// - `client`: a client's query delivered where it was sent (a pod IP, a hostNetwork
///   resolver, an external server).
pub fn leg_label(leg: &LegRecord) -> &'static str {
    let loopback = leg
        .server
        .parse::<SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback());
    if loopback {
        "stub"
    } else if leg.role == LegRole::Forward || leg.parent.is_some() {
        "upstream"
    } else if leg.server != leg.backend {
        "service"
    } else {
        "client"
    }
}

/// A malformed packet's free-text reason, sorted into a fixed set.
pub fn malformed_label(reason: &str) -> &'static str {
    if reason.starts_with("IP:") {
        "ip_header"
    } else if reason.starts_with("TCP stream:") {
        "tcp_stream"
    } else if reason.contains("shorter than the 12-byte DNS header") {
        "dns_header"
    } else if reason.starts_with("header counts") {
        "dns_counts"
    } else if ["question #", "answer #", "authority #", "additional #"]
        .iter()
        .any(|s| reason.contains(s))
    {
        "dns_record"
    } else {
        "other"
    }
}

fn is_reason_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

fn loop_kind_label(kind: LoopKind) -> &'static str {
    match kind {
        LoopKind::Cycle => "cycle",
        LoopKind::Amplification => "amplification",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabels {
    leg: &'static str,
    proto: &'static str,
    qtype: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResponseLabels {
    leg: &'static str,
    proto: &'static str,
    qtype: &'static str,
    rcode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LegLabels {
    leg: &'static str,
    proto: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QtypeLabels {
    qtype: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransactionLabels {
    qtype: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    /// Validated and capped: see [`MAX_DROP_REASONS`].
    reason: String,
    benign: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    table: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

fn latency_family<S: Clone + std::hash::Hash + Eq>() -> Family<S, Histogram> {
    Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS))
}

/// The totals of the last `stats` record, to turn its running totals into counter growth.
#[derive(Clone, Copy, Debug, Default)]
struct SeenTotals {
    lost: u64,
    drops_lost: u64,
    malformed: u64,
    summarised: u64,
    packets: u64,
    evicted_legs: u64,
    evicted_transactions: u64,
    ct_entries_evicted: u64,
    tcp_flows_evicted: u64,
}

/// A query the kernel dropped and that its client retried.
#[derive(Clone, Debug)]
struct DroppedRetried {
    client: String,
    dns_id: u16,
    retries: u64,
}

/// What the metrics must remember between records (all of it capped).
#[derive(Debug, Default)]
struct Memory {
    totals: SeenTotals,
    /// Malformed packets counted by reason since the last `stats` record.
    malformed_classified: u64,
    active_loops: HashSet<u64>,
    /// (lookup id, qtype) → step of the lookup's latest NXDOMAIN answer.
    search_nxdomain: HashMap<(u64, &'static str), u32>,
    pending_dropped: Vec<DroppedRetried>,
    /// The event stream's latest [`Events::keys_folded`].
    events_keys_folded: u64,
    /// The latest record was a race record: a transaction after it starts a new batch.
    after_race: bool,
    drop_reasons: HashSet<String>,
}

/// The agent's metrics. Shared by reference: `observe` and `encode` take `&self` (the few
/// values kept between records sit behind a mutex held for O(1) work).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    memory: Mutex<Memory>,
    queries: Family<QueryLabels, Counter>,
    responses: Family<ResponseLabels, Counter>,
    unanswered: Family<QueryLabels, Counter>,
    leg_duration: Family<LegLabels, Histogram>,
    transactions: Family<TransactionLabels, Counter>,
    transaction_duration: Family<QtypeLabels, Histogram>,
    retries: Family<CauseLabels, Counter>,
    search_nxdomain: Family<QtypeLabels, Counter>,
    kernel_drops: Family<DropLabels, Counter>,
    race_drops: Family<QtypeLabels, Counter>,
    race_suspected: Family<QtypeLabels, Counter>,
    clashes_resolved: Counter,
    loops_detected: Family<KindLabels, Counter>,
    loops_active: Gauge,
    events_lost: Family<EventLabels, Counter>,
    malformed: Family<ReasonLabels, Counter>,
    summarised: Counter,
    packets: Counter,
    evictions: Family<TableLabels, Counter>,
    fragment_losses: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("dnspath");
        let m = Metrics {
            registry: Registry::default(),
            memory: Mutex::new(Memory::default()),
            queries: Family::default(),
            responses: Family::default(),
            unanswered: Family::default(),
            leg_duration: latency_family(),
            transactions: Family::default(),
            transaction_duration: latency_family(),
            retries: Family::default(),
            search_nxdomain: Family::default(),
            kernel_drops: Family::default(),
            race_drops: Family::default(),
            race_suspected: Family::default(),
            clashes_resolved: Counter::default(),
            loops_detected: Family::default(),
            loops_active: Gauge::default(),
            events_lost: Family::default(),
            malformed: Family::default(),
            summarised: Counter::default(),
            fragment_losses: Counter::default(),
            packets: Counter::default(),
            evictions: Family::default(),
        };
        let r = &mut registry;
        // A gauge rather than an OpenMetrics `info`: Prometheus' classic text format (what
        // `promtool check metrics` reads) has no info type; CoreDNS does the same.
        let build: Family<BuildLabels, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register("build_info", "dnspath version (always 1)", build);
        r.register(
            "dns_queries",
            "Queries seen, one per leg (a client's query, its DNAT'd delivery, a forwarder's own query)",
            m.queries.clone(),
        );
        r.register(
            "dns_responses",
            "Responses seen, per leg, with the response code",
            m.responses.clone(),
        );
        r.register(
            "dns_unanswered_queries",
            "Queries that got no response (timed out, or dropped by the kernel)",
            m.unanswered.clone(),
        );
        r.register_with_unit(
            "dns_leg_duration",
            "Query to response of one leg, at the interface of its first hop",
            Unit::Seconds,
            m.leg_duration.clone(),
        );
        r.register(
            "dns_transactions",
            "Client questions followed to their end, by outcome (answered, dropped, unanswered, pending)",
            m.transactions.clone(),
        );
        r.register_with_unit(
            "dns_transaction_duration",
            "Client's first query to the answer it got, retries included",
            Unit::Seconds,
            m.transaction_duration.clone(),
        );
        r.register(
            "dns_retries",
            "Queries a client sent again, by cause: timeout, truncated (TCP fallback), conntrack_race, kernel_drop (another drop)",
            m.retries.clone(),
        );
        r.register(
            "dns_search_nxdomain",
            "Search-list steps answered NXDOMAIN before the client tried the next name",
            m.search_nxdomain.clone(),
        );
        r.register(
            "kernel_drops",
            "DNS packets the kernel dropped, by skb drop reason; benign=true for normal socket life",
            m.kernel_drops.clone(),
        );
        r.register(
            "conntrack_race_drops",
            "Queries dropped by the conntrack insert race after DNAT (kubernetes#56903)",
            m.race_drops.clone(),
        );
        r.register(
            "conntrack_race_suspected",
            "Unanswered queries of an A/AAAA pair retried at the timeout, without kernel evidence",
            m.race_suspected.clone(),
        );
        r.register(
            "conntrack_clashes_resolved",
            "Conntrack clashes the kernel resolved (the race happened, nothing was lost)",
            m.clashes_resolved.clone(),
        );
        r.register(
            "forwarding_loops_detected",
            "Forwarding loops detected",
            m.loops_detected.clone(),
        );
        r.register(
            "forwarding_loops_active",
            "Forwarding loops going on now",
            m.loops_active.clone(),
        );
        r.register(
            "events_lost",
            "Packets (event=packet) and drops (event=drop) the kernel matched that never reached dnspath",
            m.events_lost.clone(),
        );
        r.register(
            "malformed_messages",
            "Packets or TCP-framed messages that could not be decoded, by reason",
            m.malformed.clone(),
        );
        r.register(
            "ip_fragment_losses",
            "DNS datagrams whose IP fragments never all reached a hop (large answers lost on the way)",
            m.fragment_losses.clone(),
        );
        r.register(
            "summarised_packets",
            "Packets of a looping question only counted, not decoded (storm shedding)",
            m.summarised.clone(),
        );
        r.register(
            "packets",
            "Packet events received from the kernel",
            m.packets.clone(),
        );
        r.register(
            "table_evictions",
            "Entries forgotten to keep memory bounded, by table",
            m.evictions.clone(),
        );
        Metrics { registry, ..m }
    }

    fn memory(&self) -> MutexGuard<'_, Memory> {
        // The memory holds counts only: after a panic elsewhere they are still usable.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one record of the pipeline's output.
    pub fn observe(&self, record: &Record) {
        // The correlator writes a batch's transactions, then its race records: a
        // transaction after a race record begins the next batch, so the retries still
        // pending were after drops that were not races.
        let after_race = std::mem::replace(
            &mut self.memory().after_race,
            matches!(record, Record::Race(_)),
        );
        match record {
            Record::Transaction(t) => {
                if after_race {
                    self.settle_pending();
                }
                self.observe_transaction(t);
            }
            Record::Race(r) => self.observe_race(r),
            Record::Packet(p) => {
                self.settle_pending();
                self.observe_packet(p);
            }
            Record::Drop(d) => {
                self.settle_pending();
                self.observe_drop(d);
            }
            Record::Loop(l) => {
                self.settle_pending();
                self.observe_loop(l);
            }
            Record::FragmentLoss(_) => {
                self.settle_pending();
                self.fragment_losses.inc();
            }
            Record::Stats(s) => self.observe_stats(s),
        }
    }

    fn observe_packet(&self, p: &PacketRecord) {
        if let Some(reason) = &p.malformed {
            self.malformed
                .get_or_create(&ReasonLabels {
                    reason: malformed_label(reason),
                })
                .inc();
            self.memory().malformed_classified += 1;
        }
    }

    fn observe_drop(&self, d: &DropRecord) {
        let reason = {
            let mut mem = self.memory();
            if !is_reason_name(&d.reason) {
                "other".to_string()
            } else if mem.drop_reasons.contains(&d.reason) {
                d.reason.clone()
            } else if mem.drop_reasons.len() < MAX_DROP_REASONS {
                mem.drop_reasons.insert(d.reason.clone());
                d.reason.clone()
            } else {
                "other".to_string()
            }
        };
        self.kernel_drops
            .get_or_create(&DropLabels {
                reason,
                benign: if d.benign.is_some() { "true" } else { "false" },
            })
            .inc();
    }

    fn observe_transaction(&self, t: &TransactionRecord) {
        let qtype = qtype_label(&t.question.qtype);
        let outcome = match t.outcome {
            "answered" => "answered",
            "dropped" => "dropped",
            "unanswered" => "unanswered",
            _ => "pending",
        };
        self.transactions
            .get_or_create(&TransactionLabels { qtype, outcome })
            .inc();
        if let Some(ns) = t.latency_ns {
            self.transaction_duration
                .get_or_create(&QtypeLabels { qtype })
                .observe(ns as f64 / 1e9);
        }
        for leg in &t.legs {
            self.observe_leg(leg, qtype);
        }
        self.count_retries(t);
        self.count_search_step(t, qtype);
    }

    fn observe_leg(&self, leg: &LegRecord, qtype: &'static str) {
        let l = leg_label(leg);
        let proto = proto_label(leg.proto);
        self.queries
            .get_or_create(&QueryLabels {
                leg: l,
                proto,
                qtype,
            })
            .inc();
        match (leg.outcome, &leg.rcode) {
            ("answered" | "truncated", Some(rcode)) => {
                self.responses
                    .get_or_create(&ResponseLabels {
                        leg: l,
                        proto,
                        qtype,
                        rcode: rcode_label(rcode),
                    })
                    .inc();
                if let Some(ns) = leg.latency_ns {
                    self.leg_duration
                        .get_or_create(&LegLabels { leg: l, proto })
                        .observe(ns as f64 / 1e9);
                }
            }
            ("unanswered" | "dropped", _) => {
                self.unanswered
                    .get_or_create(&QueryLabels {
                        leg: l,
                        proto,
                        qtype,
                    })
                    .inc();
            }
            _ => {}
        }
    }

    /// Retries of the client's own queries (legs without a parent). A retry after a query the
    /// kernel dropped waits for the race record that follows its transaction in the same
    /// batch: `conntrack_race` if it comes, else `kernel_drop` once the batch is over (the
    /// next transaction after a race record, any other record, or a `stats` record: see
    /// [`Self::settle_pending`]).
    fn count_retries(&self, t: &TransactionRecord) {
        let mut timeout = 0u64;
        let mut truncated = 0u64;
        let mut dropped: Vec<DroppedRetried> = Vec::new();
        let query_dropped = |l: &LegRecord| l.drop.as_ref().is_some_and(|d| !d.response);
        let mut after_drop = |l: &LegRecord, n: u64| match dropped
            .iter_mut()
            .find(|d| d.client == l.client && d.dns_id == l.dns_id)
        {
            Some(d) => d.retries += n,
            None => dropped.push(DroppedRetried {
                client: l.client.clone(),
                dns_id: l.dns_id,
                retries: n,
            }),
        };
        let mut previous: Option<&LegRecord> = None;
        for leg in t.legs.iter().filter(|l| l.parent.is_none()) {
            match leg.role {
                LegRole::TcpFallback => truncated += 1,
                LegRole::Retry => match previous {
                    Some(p) if query_dropped(p) => after_drop(p, 1),
                    _ => timeout += 1,
                },
                LegRole::Query | LegRole::Forward => {}
            }
            if leg.retransmits > 0 {
                if query_dropped(leg) {
                    after_drop(leg, u64::from(leg.retransmits));
                } else {
                    timeout += u64::from(leg.retransmits);
                }
            }
            previous = Some(leg);
        }
        if timeout > 0 {
            self.retries
                .get_or_create(&CauseLabels { cause: "timeout" })
                .inc_by(timeout);
        }
        if truncated > 0 {
            self.retries
                .get_or_create(&CauseLabels { cause: "truncated" })
                .inc_by(truncated);
        }
        if dropped.is_empty() {
            return;
        }
        let mut overflow = 0u64;
        {
            let mut mem = self.memory();
            for d in dropped {
                if mem.pending_dropped.len() >= MAX_PENDING_DROPPED {
                    overflow += d.retries;
                } else {
                    mem.pending_dropped.push(d);
                }
            }
        }
        if overflow > 0 {
            self.retries
                .get_or_create(&CauseLabels {
                    cause: "kernel_drop",
                })
                .inc_by(overflow);
        }
    }

    /// Retries after a drop that no race record claimed: the drop was not a race.
    fn settle_pending(&self) {
        let n: u64 = {
            let mut mem = self.memory();
            if mem.pending_dropped.is_empty() {
                return;
            }
            mem.pending_dropped.drain(..).map(|d| d.retries).sum()
        };
        if n > 0 {
            self.retries
                .get_or_create(&CauseLabels {
                    cause: "kernel_drop",
                })
                .inc_by(n);
        }
    }

    /// A lookup's next search-list step after an NXDOMAIN one counts that step.
    fn count_search_step(&self, t: &TransactionRecord, qtype: &'static str) {
        let key = (t.lookup.id, qtype);
        let nxdomain = t.rcode.as_deref() == Some("NXDOMAIN");
        let (counted, evicted) = {
            let mut mem = self.memory();
            let counted = match mem.search_nxdomain.get(&key) {
                Some(&step) if step < t.lookup.step => {
                    mem.search_nxdomain.remove(&key);
                    true
                }
                _ => false,
            };
            let mut evicted = 0;
            if nxdomain {
                if mem.search_nxdomain.len() >= MAX_SEARCH_LOOKUPS {
                    evicted = mem.search_nxdomain.len() as u64;
                    mem.search_nxdomain.clear();
                }
                mem.search_nxdomain.insert(key, t.lookup.step);
            }
            (counted, evicted)
        };
        if counted {
            self.search_nxdomain
                .get_or_create(&QtypeLabels { qtype })
                .inc();
        }
        if evicted > 0 {
            self.evictions
                .get_or_create(&TableLabels {
                    table: "metrics_search_lookups",
                })
                .inc_by(evicted);
        }
    }

    fn observe_race(&self, r: &RaceRecord) {
        let qtype = r
            .dropped
            .as_ref()
            .map(|q| qtype_label(&q.question.qtype))
            .unwrap_or("other");
        match r.verdict {
            RaceVerdict::RaceDrop => {
                self.race_drops.get_or_create(&QtypeLabels { qtype }).inc();
                let claimed = r.dropped.as_ref().and_then(|q| {
                    let mut mem = self.memory();
                    let i = mem
                        .pending_dropped
                        .iter()
                        .position(|d| d.client == r.client && d.dns_id == q.dns_id)?;
                    Some(mem.pending_dropped.swap_remove(i).retries)
                });
                if let Some(n) = claimed.filter(|&n| n > 0) {
                    self.retries
                        .get_or_create(&CauseLabels {
                            cause: "conntrack_race",
                        })
                        .inc_by(n);
                }
            }
            RaceVerdict::Suspected => {
                self.race_suspected
                    .get_or_create(&QtypeLabels { qtype })
                    .inc();
            }
            RaceVerdict::ResolvedClash => {
                self.clashes_resolved
                    .inc_by(r.counters.clash_resolve.max(1));
            }
        }
    }

    fn observe_loop(&self, l: &LoopRecord) {
        if l.state == LoopState::Detected {
            self.loops_detected
                .get_or_create(&KindLabels {
                    kind: loop_kind_label(l.kind),
                })
                .inc();
        }
        let active = {
            let mut mem = self.memory();
            match l.state {
                LoopState::Detected | LoopState::Ongoing => {
                    if mem.active_loops.len() < MAX_ACTIVE_LOOPS {
                        mem.active_loops.insert(l.id);
                    }
                }
                LoopState::Ended => {
                    mem.active_loops.remove(&l.id);
                }
            }
            mem.active_loops.len()
        };
        self.loops_active
            .set(i64::try_from(active).unwrap_or(i64::MAX));
    }

    /// Counts what lives only in the running totals of a `stats` record: lost events,
    /// evictions, malformed packets not seen as records (`reason="unclassified"`), summarised
    /// packets. Totals that go down (a new pipeline) start counting again from there.
    pub fn observe_stats(&self, s: &StatsRecord) {
        self.settle_pending();
        let correlate = s.correlate.as_ref();
        let now = SeenTotals {
            lost: s.lost,
            drops_lost: s.drops_lost,
            malformed: s.malformed,
            summarised: s.summarised,
            packets: s.packets,
            evicted_legs: correlate.map_or(0, |c| c.evicted_legs),
            evicted_transactions: correlate.map_or(0, |c| c.evicted_transactions),
            ct_entries_evicted: correlate.map_or(0, |c| c.ct_entries_evicted),
            tcp_flows_evicted: s.tcp_flows_evicted,
        };
        let (was, classified, no_loops) = {
            let mut mem = self.memory();
            let was = std::mem::replace(&mut mem.totals, now);
            let classified = std::mem::take(&mut mem.malformed_classified);
            let no_loops = correlate.is_some_and(|c| c.loops.active == 0);
            if no_loops {
                mem.active_loops.clear();
            }
            (was, classified, no_loops)
        };
        let grew = |now: u64, was: u64| if now >= was { now - was } else { now };
        let add = |c: &Counter, n: u64| {
            if n > 0 {
                c.inc_by(n);
            }
        };
        add(
            &self
                .events_lost
                .get_or_create(&EventLabels { event: "packet" }),
            grew(now.lost, was.lost),
        );
        add(
            &self
                .events_lost
                .get_or_create(&EventLabels { event: "drop" }),
            grew(now.drops_lost, was.drops_lost),
        );
        add(
            &self.malformed.get_or_create(&ReasonLabels {
                reason: "unclassified",
            }),
            grew(now.malformed, was.malformed).saturating_sub(classified),
        );
        add(&self.summarised, grew(now.summarised, was.summarised));
        add(&self.packets, grew(now.packets, was.packets));
        for (table, n) in [
            ("legs", grew(now.evicted_legs, was.evicted_legs)),
            (
                "transactions",
                grew(now.evicted_transactions, was.evicted_transactions),
            ),
            (
                "conntrack",
                grew(now.ct_entries_evicted, was.ct_entries_evicted),
            ),
            (
                "tcp_flows",
                grew(now.tcp_flows_evicted, was.tcp_flows_evicted),
            ),
        ] {
            add(&self.evictions.get_or_create(&TableLabels { table }), n);
        }
        if no_loops {
            self.loops_active.set(0);
        }
    }

    /// Counts the event stream's folds beyond its server cap
    /// (`dnspath_table_evictions_total{table="events_servers"}`): call it now and then
    /// (e.g. before a scrape is answered, or at each tick) with the stream's total.
    pub fn observe_events(&self, events: &Events) {
        let now = events.keys_folded();
        let was = std::mem::replace(&mut self.memory().events_keys_folded, now);
        let n = if now >= was { now - was } else { now };
        if n > 0 {
            self.evictions
                .get_or_create(&TableLabels {
                    table: "events_servers",
                })
                .inc_by(n);
        }
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn encode(&self) -> String {
        self.encode_as(Exposition::OpenMetrics)
    }

    /// The exposition in either text format (a scrape's `Accept` header chooses).
    pub fn encode_as(&self, format: Exposition) -> String {
        let mut out = String::new();
        let encoded = match format {
            Exposition::OpenMetrics => encode(&mut out, &self.registry),
            Exposition::PrometheusText => prometheus_text::encode(&mut out, &self.registry),
        };
        // Writing into a String cannot fail; an error could only come from an encoder, and
        // what was written before it is still the best answer to a scrape.
        if let Err(e) = encoded {
            log::warn!("encoding metrics: {e}");
        }
        out
    }
}

/// The two text formats Prometheus scrapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposition {
    /// OpenMetrics 1.0 text: what Prometheus asks for first.
    OpenMetrics,
    /// Prometheus' classic text format 0.0.4 (`promtool check metrics`, older scrapers).
    PrometheusText,
}

impl Exposition {
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Exposition::PrometheusText => prometheus_text::CONTENT_TYPE,
        }
    }

    /// The format a scrape's `Accept` header asks for: OpenMetrics when it names it (as
    /// Prometheus does), else the classic text format.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Exposition::OpenMetrics,
            _ => Exposition::PrometheusText,
        }
    }
}

/// The content type of [`Metrics::encode`]'s text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
