//! How each record moves the metrics, and the little the metrics remember between records
//! (every part of it capped).
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use prometheus_client::metrics::{counter::Counter, histogram::Histogram};

use super::{
    labels::{
        is_reason_name, leg_label, loop_kind_label, malformed_label, pod_namespace, qtype_label,
        rcode_label, CauseLabels, DetectionLabels, DropLabels, EventLabels, FindingLabels,
        KindLabels, LegLabels, NamespaceLabel, QtypeLabels, QueryLabels, ReasonLabels,
        ResponseLabels, SearchLabels, TableLabels, TransactionLabels,
    },
    Metrics, MAX_DROP_REASONS,
};
use crate::{
    agent::events::Events,
    correlate::{record::LegOutcome, LegRole},
    detect::{
        loops::{LoopRecord, LoopState},
        race::{RaceRecord, RaceVerdict},
        Detected,
    },
    output::{
        otlp::spans::client_is_local,
        record::{DropRecord, LegRecord, PacketRecord, Record, StatsRecord, TransactionRecord},
    },
};

/// Loop ids remembered to keep `dnspath_forwarding_loops_active` right (the correlator keeps
/// at most 1 024 loop reports).
const MAX_ACTIVE_LOOPS: usize = 4096;
/// Search lookups whose latest step was NXDOMAIN, remembered until their next step.
const MAX_SEARCH_LOOKUPS: usize = 4096;
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

/// What the metrics must remember between records (all of it capped).
#[derive(Debug, Default)]
pub(super) struct Memory {
    totals: SeenTotals,
    /// Malformed packets counted by reason since the last `stats` record.
    malformed_classified: u64,
    active_loops: HashSet<u64>,
    /// (lookup id, qtype) → step of the lookup's latest NXDOMAIN answer.
    search_nxdomain: HashMap<(u64, &'static str), u32>,
    /// The event stream's latest [`Events::keys_folded`].
    events_keys_folded: u64,
    drop_reasons: HashSet<String>,
    /// Namespaces with a `namespace` label of their own (`--namespace-label`).
    namespaces: HashSet<Arc<str>>,
    /// Server keys of the event stream's current window (its [`Events::keys`]).
    events_keys: usize,
    /// Findings windows closed, and records they did not follow, at the last look.
    findings_closed: u64,
    findings_untracked: u64,
    series: Series,
}

/// The per-query series of the metrics without a `namespace` label, by their labels'
/// addresses: every label of these is a `&'static str` of a fixed set, so a handful of
/// series, each found by a few words hashed instead of its labels' text (a family's map
/// hashes every label with SipHash; a transaction of one leg looks up five series). A
/// handle shares its series' value with the family (the registry encodes the same one).
#[derive(Debug, Default)]
struct Series {
    counters: HashMap<SeriesKey, Counter, foldhash::fast::RandomState>,
    histograms: HashMap<SeriesKey, Histogram, foldhash::fast::RandomState>,
}

/// (family, its labels' addresses and lengths): the same key is the same labels. Labels
/// of equal text at two addresses are two keys of one series (the family's).
type SeriesKey = (Family, [(usize, usize); 4]);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Family {
    Queries,
    Responses,
    Unanswered,
    LegDuration,
    Transactions,
    TransactionDuration,
}

fn series_key(family: Family, labels: [&'static str; 4]) -> SeriesKey {
    (family, labels.map(|l| (l.as_ptr() as usize, l.len())))
}

impl Metrics {
    /// Adds one to the counter of `family` with `labels`: from the series' handle when
    /// `namespace` is none (every label static), else from the family by `make`'s labels.
    fn inc(
        &self,
        family: Family,
        labels: [&'static str; 4],
        namespace: &NamespaceLabel,
        get: impl FnOnce() -> Counter,
    ) {
        if namespace.0.is_some() {
            get().inc();
            return;
        }
        let key = series_key(family, labels);
        let mut mem = self.memory();
        mem.series.counters.entry(key).or_insert_with(get).inc();
    }

    /// [`Metrics::inc`] for a histogram (whose labels are all static): observes `v`.
    fn observe_in(
        &self,
        family: Family,
        labels: [&'static str; 4],
        v: f64,
        get: impl FnOnce() -> Histogram,
    ) {
        let key = series_key(family, labels);
        let mut mem = self.memory();
        mem.series
            .histograms
            .entry(key)
            .or_insert_with(get)
            .observe(v);
    }

    /// Counts one record of the pipeline's output.
    pub fn observe(&self, record: &Record) {
        match record {
            Record::Transaction(t) => self.observe_transaction(t),
            Record::Detected(d) => self.observe_detected(d),
            Record::Packet(p) => self.observe_packet(p),
            Record::Drop(d) => self.observe_drop(d),
            Record::FragmentLoss(_) => {
                self.fragment_losses.inc();
            }
            Record::Stats(s) => self.observe_stats(s),
            Record::Summary(_) => {}
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
        let (reason, folded) = {
            let mut mem = self.memory();
            if !is_reason_name(&d.reason) {
                ("other".to_string(), false)
            } else if mem.drop_reasons.contains(&d.reason) {
                (d.reason.clone(), false)
            } else if mem.drop_reasons.len() < MAX_DROP_REASONS {
                mem.drop_reasons.insert(d.reason.clone());
                (d.reason.clone(), false)
            } else {
                ("other".to_string(), true)
            }
        };
        if folded {
            self.evict("metrics_drop_reasons", 1);
        }
        self.kernel_drops
            .get_or_create(&DropLabels {
                reason,
                benign: if d.benign.is_some() { "true" } else { "false" },
            })
            .inc();
    }

    /// A question of this node's client counts as a client question (`transactions`,
    /// its duration, retries, search steps) and its legs by where they went; a query from
    /// another node's client only as the queries this node served (`leg="served"`) and the
    /// upstream queries it caused: the client's node counts the question, so a sum over
    /// every node's metrics counts it once.
    fn observe_transaction(&self, t: &TransactionRecord) {
        let qtype = qtype_label(t.question.qtype);
        if !client_is_local(t) {
            let namespace = self.namespace_of(t);
            for leg in &t.legs {
                let l = if leg.parent.is_none() {
                    "served"
                } else {
                    leg_label(leg)
                };
                self.observe_leg(leg, l, qtype, &namespace);
            }
            return;
        }
        let outcome = t.outcome.as_str();
        let namespace = self.namespace_of(t);
        self.inc(
            Family::Transactions,
            [qtype, outcome, "", ""],
            &namespace,
            || {
                self.transactions
                    .get_or_create(&TransactionLabels {
                        qtype,
                        outcome,
                        namespace: namespace.clone(),
                    })
                    .clone()
            },
        );
        if let Some(ns) = t.latency_ns {
            self.observe_in(
                Family::TransactionDuration,
                [qtype, "", "", ""],
                ns as f64 / 1e9,
                || {
                    self.transaction_duration
                        .get_or_create(&QtypeLabels { qtype })
                        .clone()
                },
            );
        }
        for leg in &t.legs {
            self.observe_leg(leg, leg_label(leg), qtype, &namespace);
        }
        self.count_retries(t);
        self.count_search_step(t, qtype, namespace);
    }

    /// The `namespace` label of a transaction's client (nothing without
    /// `--namespace-label`): at most the configured number of distinct namespaces, the
    /// rest `other`, counted as evictions of table `metrics_namespaces`.
    fn namespace_of(&self, t: &TransactionRecord) -> NamespaceLabel {
        let Some(max) = self.config.namespace_label else {
            return NamespaceLabel(None);
        };
        let ns = t.pod.pod.as_deref().map_or("", pod_namespace);
        let (label, folded) = {
            let mut mem = self.memory();
            if ns.is_empty() || ns == "other" {
                (Arc::from(ns), false)
            } else if let Some(known) = mem.namespaces.get(ns) {
                (Arc::clone(known), false)
            } else if mem.namespaces.len() < max {
                let known: Arc<str> = Arc::from(ns);
                mem.namespaces.insert(Arc::clone(&known));
                (known, false)
            } else {
                (Arc::from("other"), true)
            }
        };
        if folded {
            self.evict("metrics_namespaces", 1);
        }
        NamespaceLabel(Some(label))
    }

    fn observe_leg(
        &self,
        leg: &LegRecord,
        l: &'static str,
        qtype: &'static str,
        namespace: &NamespaceLabel,
    ) {
        let proto = leg.proto.as_str();
        self.inc(Family::Queries, [l, proto, qtype, ""], namespace, || {
            self.queries
                .get_or_create(&QueryLabels {
                    leg: l,
                    proto,
                    qtype,
                    namespace: namespace.clone(),
                })
                .clone()
        });
        match (leg.outcome, &leg.rcode) {
            (LegOutcome::Answered | LegOutcome::Truncated, Some(rcode)) => {
                let rcode = rcode_label(rcode);
                self.inc(
                    Family::Responses,
                    [l, proto, qtype, rcode],
                    namespace,
                    || {
                        self.responses
                            .get_or_create(&ResponseLabels {
                                leg: l,
                                proto,
                                qtype,
                                rcode,
                                namespace: namespace.clone(),
                            })
                            .clone()
                    },
                );
                if let Some(ns) = leg.latency_ns {
                    self.observe_in(
                        Family::LegDuration,
                        [l, proto, "", ""],
                        ns as f64 / 1e9,
                        || {
                            self.leg_duration
                                .get_or_create(&LegLabels { leg: l, proto })
                                .clone()
                        },
                    );
                }
            }
            (LegOutcome::Unanswered | LegOutcome::Dropped | LegOutcome::Late, _) => {
                self.inc(Family::Unanswered, [l, proto, qtype, ""], namespace, || {
                    self.unanswered
                        .get_or_create(&QueryLabels {
                            leg: l,
                            proto,
                            qtype,
                            namespace: namespace.clone(),
                        })
                        .clone()
                });
            }
            _ => {}
        }
    }

    /// Retries of the client's own queries (legs without a parent). A retry after a query the
    /// kernel dropped counts as `conntrack_race` when the correlator marked that query's leg
    /// [`LegRecord::race_drop`], else as `kernel_drop`.
    fn count_retries(&self, t: &TransactionRecord) {
        let (mut timeout, mut truncated, mut race, mut kernel) = (0u64, 0u64, 0u64, 0u64);
        let query_dropped = |l: &LegRecord| l.drop.as_ref().is_some_and(|d| !d.response);
        let mut after_drop = |l: &LegRecord, n: u64| {
            if l.race_drop {
                race += n;
            } else {
                kernel += n;
            }
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
        for (cause, n) in [
            ("timeout", timeout),
            ("truncated", truncated),
            ("conntrack_race", race),
            ("kernel_drop", kernel),
        ] {
            if n > 0 {
                self.retries.get_or_create(&CauseLabels { cause }).inc_by(n);
            }
        }
    }

    /// A lookup's next search-list step after an NXDOMAIN one counts that step.
    fn count_search_step(
        &self,
        t: &TransactionRecord,
        qtype: &'static str,
        namespace: NamespaceLabel,
    ) {
        let key = (t.lookup.id, qtype);
        let nxdomain = t.rcode == Some(crate::decode::dns::Rcode::NXDOMAIN);
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
                .get_or_create(&SearchLabels { qtype, namespace })
                .inc();
        }
        if evicted > 0 {
            self.evict("metrics_search_lookups", evicted);
        }
    }

    /// A detection: counted when it is news; loops and races also in their own metrics.
    fn observe_detected(&self, d: &Detected) {
        if d.get().failure().is_some() {
            self.detections
                .get_or_create(&DetectionLabels {
                    detection: d.name(),
                })
                .inc();
        }
        if let Detected::Loop(l) = d {
            self.observe_loop(l);
        } else if let Detected::Race(r) = d {
            self.observe_race(r);
        }
    }

    fn observe_race(&self, r: &RaceRecord) {
        let qtype = r
            .dropped
            .as_ref()
            .map(|q| qtype_label(q.question.qtype))
            .unwrap_or("other");
        match r.verdict {
            RaceVerdict::RaceDrop => {
                self.race_drops.get_or_create(&QtypeLabels { qtype }).inc();
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
        let (active, full) = {
            let mut mem = self.memory();
            let mut full = false;
            match l.state {
                LoopState::Detected | LoopState::Ongoing => {
                    if mem.active_loops.len() < MAX_ACTIVE_LOOPS {
                        mem.active_loops.insert(l.id);
                    } else {
                        full = !mem.active_loops.contains(&l.id);
                    }
                }
                LoopState::Ended => {
                    mem.active_loops.remove(&l.id);
                }
            }
            (mem.active_loops.len(), full)
        };
        if full {
            self.evict("metrics_active_loops", 1);
        }
        self.loops_active
            .set(i64::try_from(active).unwrap_or(i64::MAX));
    }

    /// Counts what lives only in the running totals of a `stats` record: lost events,
    /// evictions, malformed packets not seen as records (`reason="unclassified"`), summarised
    /// packets. Totals that go down (a new pipeline) start counting again from there.
    pub fn observe_stats(&self, s: &StatsRecord) {
        if let Some(o) = &s.otlp {
            self.otlp.observe(o);
        }
        if let Some(c) = &s.conntrack {
            self.conntrack.observe(c);
        }
        let correlate = s.correlate.as_ref();
        let now = SeenTotals {
            lost: s.decode.lost,
            drops_lost: s.decode.drops_lost,
            malformed: s.decode.malformed,
            summarised: s.decode.summarised + s.decode.shed,
            packets: s.decode.packets,
            evicted_legs: correlate.map_or(0, |c| c.evicted_legs),
            evicted_transactions: correlate.map_or(0, |c| c.evicted_transactions),
            ct_entries_evicted: correlate.map_or(0, |c| c.ct_entries_evicted),
            tcp_flows_evicted: s.decode.tcp_flows_evicted,
        };
        let (was, classified, no_loops) = {
            let mut mem = self.memory();
            let was = std::mem::replace(&mut mem.totals, now);
            let classified = std::mem::take(&mut mem.malformed_classified);
            let no_loops = correlate.is_some_and(|c| c.detect.loops.active == 0);
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
    /// (`dnspath_table_evictions_total{table="events_servers"}`) and the records its
    /// findings windows did not follow (`…{table="findings"}`), and sets `dnspath_findings`
    /// when a findings window has closed: call it now and then (e.g. at each tick) with the
    /// stream.
    pub fn observe_events(&self, events: &Events) {
        let now = events.keys_folded();
        let (findings, closed) = events.findings_last();
        let untracked = events.findings_untracked();
        let (was, new_window, untracked_was) = {
            let mut mem = self.memory();
            mem.events_keys = events.keys();
            let new_window = std::mem::replace(&mut mem.findings_closed, closed) != closed;
            let untracked_was = std::mem::replace(&mut mem.findings_untracked, untracked);
            (
                std::mem::replace(&mut mem.events_keys_folded, now),
                new_window,
                untracked_was,
            )
        };
        let n = if now >= was { now - was } else { now };
        if n > 0 {
            self.evict("events_servers", n);
        }
        if untracked > untracked_was {
            self.evict("findings", untracked - untracked_was);
        }
        if new_window {
            for (kind, count) in findings {
                self.findings
                    .get_or_create(&FindingLabels {
                        kind: kind.as_str(),
                        severity: kind.severity().as_str(),
                    })
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
            }
        }
    }

    fn evict(&self, table: &'static str, n: u64) {
        self.evictions
            .get_or_create(&TableLabels { table })
            .inc_by(n);
    }

    /// Entries of the agent's own tables now, for `dnspath_table_entries` (with their caps
    /// in [`Self::table_caps`]).
    pub(super) fn table_sizes(&self) -> [(&'static str, usize); 5] {
        let mem = self.memory();
        [
            ("metrics_search_lookups", mem.search_nxdomain.len()),
            ("metrics_active_loops", mem.active_loops.len()),
            ("metrics_drop_reasons", mem.drop_reasons.len()),
            ("metrics_namespaces", mem.namespaces.len()),
            ("events_servers", mem.events_keys),
        ]
    }

    /// The caps of [`Self::table_sizes`]' tables (`metrics_namespaces`: 0 without
    /// `--namespace-label`).
    pub(super) fn table_caps(&self) -> [(&'static str, usize); 5] {
        [
            ("metrics_search_lookups", MAX_SEARCH_LOOKUPS),
            ("metrics_active_loops", MAX_ACTIVE_LOOPS),
            ("metrics_drop_reasons", MAX_DROP_REASONS),
            (
                "metrics_namespaces",
                self.config.namespace_label.unwrap_or(0),
            ),
            ("events_servers", self.config.events_servers),
        ]
    }
}
