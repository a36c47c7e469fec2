//! Correlate stage: hops → legs → transactions → lookups.
//!
//! - A **hop** is one observation of one DNS message: where, when, the addresses as seen there.
//! - A **leg** is one query and its response between a client socket and a server, joined
//!   across every point it was seen and across DNAT/SNAT. Hops join a leg by
//!   (transport, client port, DNS id, question), where the client port is the one of the
//!   flow's *original* conntrack tuple when conntrack knows the flow ("conntrack"), else the
//!   port as seen ("fallback" when the addresses differ between hops, "same-tuple" when not).
//! - Legs form a **transaction** tree: a server that receives a question and, within a window,
//!   sends the same question elsewhere makes the second leg a child of the first (never when
//!   the second comes from the host — on loopback, the namespace — of the first's client: that
//!   is another client, or the client's retry, not a forward). Retries of
//!   an unanswered query and the TCP retry of a truncated answer are further attempts of the
//!   same transaction.
//! - Transactions of one client asking a name and its search-list expansions
//!   (`name.ns.svc.cluster.local`, …, `name.`) share a **lookup**.
//!
//! Observations are reordered by timestamp within a short window (events of different CPUs
//! and the conntrack socket arrive out of order). All state is bounded; what is evicted is
//! counted.
pub mod ctmap;
pub mod loops;
pub mod race;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
};

use serde::Serialize;

use crate::{
    decode::dns::{Cut, DnsMessage},
    event::{ConntrackEvent, CtSnapshot, CtStatsSample, ObservationPoint},
    output::record::{
        HopRecord, LegDrop, LegRecord, LookupRef, QuestionRecord, Record, TransactionRecord,
    },
    time::Clock,
};
use ctmap::CtMap;
use loops::{LoopHop, LoopTracker};
use race::{CtSamples, RaceQuery, RaceRecord, RaceVerdict};

/// One decoded DNS message at one observation point (decode → correlate).
#[derive(Clone, Debug)]
pub struct Observation {
    pub ts_ns: u64,
    pub at: ObservationPoint,
    /// Display names of the namespace and interface.
    pub netns: String,
    pub ifname: String,
    /// IPPROTO_UDP or IPPROTO_TCP.
    pub proto: u8,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub msg: DnsMessage,
}

/// A kernel drop of a DNS packet (decode → correlate).
#[derive(Clone, Debug)]
pub struct DropObservation {
    pub ts_ns: u64,
    pub cpu: u32,
    /// Cookie of the namespace (whose conntrack statistics tell a race).
    pub netns_cookie: u64,
    pub netns: String,
    pub ifname: String,
    pub reason: String,
    pub location: String,
    /// The function part of `location`.
    pub function: String,
    pub benign: bool,
    pub proto: u8,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub ct: Option<CtSnapshot>,
    /// With the conntrack-confirm hook loaded: whether the kernel's confirm of this packet
    /// failed (`NF_DROP`); `None` without the hook.
    pub confirm_failed: Option<bool>,
    pub msg: Option<DnsMessage>,
}

#[derive(Clone, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "drops are rare; boxing every message to shrink them is not worth an allocation"
)]
pub enum Observed {
    Message(Observation),
    Drop(DropObservation),
}

impl Observed {
    fn ts(&self) -> u64 {
        match self {
            Observed::Message(o) => o.ts_ns,
            Observed::Drop(d) => d.ts_ns,
        }
    }
}

/// Windows and bounds.
#[derive(Clone, Copy, Debug)]
pub struct CorrelateConfig {
    /// A query without an answer for this long is unanswered (resolv.conf's default 5 s).
    pub timeout_ns: u64,
    /// Quiet time after a transaction's last hop before it is reported.
    pub settle_ns: u64,
    /// How long after a timeout a retry is still waited for.
    pub retry_grace_ns: u64,
    /// A forwarder's own query counts as a child if sent this soon after the client's.
    pub forward_window_ns: u64,
    /// Search-list steps of one lookup follow each other within this window.
    pub lookup_window_ns: u64,
    /// Observations are reordered within this window (CPUs' ring-buffer records and
    /// conntrack events arrive out of order).
    pub reorder_ns: u64,
    pub max_legs: usize,
    pub max_ct_entries: usize,
    pub max_hops_per_leg: usize,
    /// Legs kept per transaction (a loop grows its tree without end).
    pub max_legs_per_transaction: usize,
}

impl Default for CorrelateConfig {
    fn default() -> Self {
        Self {
            timeout_ns: 5_000_000_000,
            settle_ns: 300_000_000,
            retry_grace_ns: 1_500_000_000,
            forward_window_ns: 2_000_000_000,
            lookup_window_ns: 3_000_000_000,
            reorder_ns: 60_000_000,
            max_legs: 65_536,
            max_ct_entries: 262_144,
            max_hops_per_leg: 64,
            max_legs_per_transaction: 64,
        }
    }
}

/// Counters of the correlate stage.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CorrelateStats {
    pub transactions: u64,
    pub legs: u64,
    /// Responses whose query was never seen (started before the trace, or evicted).
    pub orphan_responses: u64,
    /// Messages without a question (cannot be keyed).
    pub unkeyed: u64,
    pub drops_attached: u64,
    pub drops_unmatched: u64,
    /// Legs forgotten to keep memory bounded (their transactions are not reported).
    pub evicted_legs: u64,
    pub evicted_transactions: u64,
    /// Hops not stored because a leg already had `max_hops_per_leg`.
    pub hops_not_stored: u64,
    pub ct_entries_evicted: u64,
    /// Observations handled out of the reorder window (arrived too late).
    pub late_observations: u64,
    /// Legs not kept because their transaction already had `max_legs_per_transaction`.
    pub legs_not_stored: u64,
    /// Messages of a question in an active loop: counted towards the loop, not correlated.
    pub loop_messages: u64,
    pub loops: loops::LoopStats,
    pub races: race::RaceStats,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QKey {
    name: String,
    qtype: String,
    class: String,
}

impl QKey {
    fn of(msg: &DnsMessage) -> Option<QKey> {
        let q = msg.questions.first()?;
        Some(QKey {
            name: q.name.to_ascii_lowercase(),
            qtype: q.qtype.clone(),
            class: q.class.clone(),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct LegKey {
    proto: u8,
    client_port: u16,
    id: u16,
    q: QKey,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    /// Same addresses as the leg's first hop.
    Same,
    /// Addresses differ; joined through the conntrack entry.
    Conntrack,
    /// Addresses differ; joined by (client port, DNS id, question) alone.
    Fallback,
}

#[derive(Clone, Debug)]
struct Hop {
    ts_ns: u64,
    at: ObservationPoint,
    netns: String,
    ifname: String,
    src: SocketAddr,
    dst: SocketAddr,
    dns_id: u16,
    qr: bool,
    via: Via,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LegRole {
    /// The client's first query.
    Query,
    /// The same question again from the same client after no answer.
    Retry,
    /// The same question over TCP after a truncated UDP answer.
    TcpFallback,
    /// A server forwarding the question it received.
    Forward,
}

#[derive(Clone, Debug)]
struct Response {
    ts_ns: u64,
    rcode: String,
    tc: bool,
    answers: Vec<String>,
    /// The capture cut the response (at every hop it was seen whole at none): `answers` are
    /// those that fit.
    cut: Option<Cut>,
}

impl Response {
    fn of(ts_ns: u64, msg: &DnsMessage) -> Self {
        Response {
            ts_ns,
            rcode: msg.rcode.clone(),
            tc: msg.flags.tc,
            answers: msg
                .answers
                .iter()
                .map(|r| format!("{} {}", r.rtype, r.data))
                .collect(),
            cut: msg.cut,
        }
    }
}

/// `answer cut by the capture at 200 of 731 bytes: 1 of 8 answers seen`.
fn cut_note(c: &Cut, answers_seen: usize) -> String {
    let at = format!(
        "answer cut by the capture at {} of {} bytes",
        c.captured_bytes, c.message_bytes
    );
    if c.questions > 0 {
        format!("{at}: question not seen whole")
    } else if c.answers > 0 {
        let total = answers_seen + usize::from(c.answers);
        format!("{at}: {answers_seen} of {total} answers seen")
    } else {
        format!("{at}, after its answers")
    }
}

#[derive(Clone, Debug)]
struct Leg {
    id: u64,
    key: LegKey,
    tx: u64,
    parent: Option<u64>,
    role: LegRole,
    first_ts: u64,
    last_ts: u64,
    /// Client and server as at the first query hop.
    client: SocketAddr,
    server: SocketAddr,
    /// Where the query was last seen going (after DNAT: the pod).
    backend: SocketAddr,
    backend_at: Option<(ObservationPoint, String)>,
    /// Namespace of the latest query hop: where the query was delivered, as far as seen.
    delivered_ns: String,
    client_netns: String,
    client_point: ObservationPoint,
    hops: Vec<Hop>,
    retransmits: u32,
    response: Option<Response>,
    drop: Option<LegDrop>,
    /// The drop was a failed conntrack confirm: (cpu, netns cookie, ts, backend it was
    /// DNAT'd to).
    race: Option<(u32, u64, u64, SocketAddr, Option<bool>)>,
    timed_out: bool,
    /// Still waiting when the input ended (trace stopped before the timeout).
    cut_short: bool,
}

impl Leg {
    fn closed(&self) -> bool {
        self.response.is_some() || self.timed_out || self.cut_short
    }
}

#[derive(Clone, Debug)]
struct Transaction {
    id: u64,
    lookup: u64,
    lookup_step: u32,
    legs: Vec<u64>,
    first_ts: u64,
    last_activity: u64,
    /// When [`Correlator::finish`] looks at it next (its entry in `wakes`).
    wake_at: u64,
}

#[derive(Clone, Debug)]
struct LookupState {
    id: u64,
    /// Names asked so far, lowercase, in order (distinct).
    names: Vec<String>,
    last_ts: u64,
}

/// Could `a` and `b` be two steps of one search-list expansion? Both are the name the user
/// typed followed by a search domain (possibly none), and Kubernetes-style search lists are
/// nested (`ns.svc.cluster.local`, `svc.cluster.local`, `cluster.local`): after their common
/// leading labels, one remainder is a trailing part of the other.
fn same_lookup_names(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let la: Vec<&str> = a.trim_end_matches('.').split('.').collect();
    let lb: Vec<&str> = b.trim_end_matches('.').split('.').collect();
    let common = la.iter().zip(&lb).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return false;
    }
    let (ra, rb) = (&la[common..], &lb[common..]);
    ra.ends_with(rb) || rb.ends_with(ra)
}

/// The correlator. Feed it observations and conntrack events; call [`Correlator::tick`]
/// regularly (live: every ~100 ms; offline: as file time advances) and
/// [`Correlator::flush`] at the end.
pub struct Correlator {
    cfg: CorrelateConfig,
    clock: Clock,
    ct: CtMap,
    pending: BTreeMap<(u64, u64), Observed>,
    seq: u64,
    watermark: u64,
    legs: HashMap<u64, Leg>,
    by_key: HashMap<LegKey, u64>,
    /// Unanswered legs by question (the newest [`MAX_CANDIDATES`]), to find a forwarder's
    /// parent.
    open_by_q: HashMap<QKey, Vec<u64>>,
    /// Client (root) legs by client address and question (the newest [`MAX_CANDIDATES`]), for
    /// retries and TCP fallback.
    roots_by_q: HashMap<(IpAddr, QKey), Vec<u64>>,
    /// Client (root) legs by client socket (the newest [`MAX_CANDIDATES`]), for the sibling of
    /// an A/AAAA pair.
    roots_by_socket: HashMap<SocketAddr, Vec<u64>>,
    txs: BTreeMap<u64, Transaction>,
    /// (time, transaction) to look at: whether it is done, or when to look again; one entry
    /// per transaction (its `wake_at`).
    wakes: BTreeSet<(u64, u64)>,
    /// (timeout, leg): when each open leg's query goes unanswered.
    timeouts: BTreeSet<(u64, u64)>,
    lookups: HashMap<(IpAddr, String), LookupState>,
    next_id: u64,
    stats: CorrelateStats,
    loops: LoopTracker,
    ct_samples: CtSamples,
    /// Recent client queries by socket, to find the sibling of a dropped one (A/AAAA pair)
    /// after its own transaction has been reported: (first ts, dns id, question, backend).
    recent: HashMap<SocketAddr, VecDeque<(u64, u16, QKey, SocketAddr)>>,
    /// `recent`'s entries in insertion order, for pruning the oldest in O(1).
    recent_order: VecDeque<(u64, SocketAddr)>,
    race_out: Vec<RaceRecord>,
}

/// The server a leg's query was delivered to, for deciding that a question came back to a
/// server already on its chain: after DNAT the pod, not the ClusterIP (a pod forwarding to
/// its own Service is only a loop once the Service sends the question back to a server of
/// the chain). Loopback addresses are only the same server within one namespace.
type Endpoint = (SocketAddr, Option<String>);

fn endpoint(l: &Leg) -> Endpoint {
    let ns = if l.backend.ip().is_loopback() {
        Some(l.delivered_ns.clone())
    } else {
        None
    };
    (l.backend, ns)
}

impl Correlator {
    pub fn new(cfg: CorrelateConfig, clock: Clock) -> Self {
        Self {
            clock,
            ct: CtMap::new(cfg.max_ct_entries),
            cfg,
            pending: BTreeMap::new(),
            seq: 0,
            watermark: 0,
            legs: HashMap::new(),
            by_key: HashMap::new(),
            open_by_q: HashMap::new(),
            roots_by_q: HashMap::new(),
            roots_by_socket: HashMap::new(),
            txs: BTreeMap::new(),
            wakes: BTreeSet::new(),
            timeouts: BTreeSet::new(),
            lookups: HashMap::new(),
            next_id: 1,
            stats: CorrelateStats::default(),
            loops: LoopTracker::new(clock),
            ct_samples: CtSamples::default(),
            recent: HashMap::new(),
            recent_order: VecDeque::new(),
            race_out: Vec::new(),
        }
    }

    /// A conntrack statistics sample: kept to confirm races; resolved clashes are reported.
    pub fn on_ct_stats(&mut self, s: CtStatsSample) {
        let (ts, netns) = (s.ts_ns, s.netns);
        for (cpu, n) in self.ct_samples.add(s) {
            self.stats.races.resolved_clashes += n;
            self.race_out.push(RaceRecord {
                pod: Default::default(),
                verdict: RaceVerdict::ResolvedClash,
                ts_ns: ts,
                time: self.clock.wall(ts),
                netns: format!("netns:{netns:#x}"),
                client: String::new(),
                client_netns: String::new(),
                dropped: None,
                sibling: None,
                cpu: Some(cpu),
                counters: race::CounterDeltas {
                    clash_resolve: n,
                    ..Default::default()
                },
                counter_confirmed: true,
                kernel_confirm_failed: None,
                drop_reason: None,
                drop_location: None,
                retry_ns: None,
                total_delay_ns: None,
                summary: format!("{n} conntrack clash(es) resolved by the kernel on CPU {cpu}: the race happened, nothing was lost"),
            });
        }
    }

    /// Keeps a reported client query for a while: (socket, first ts, id, question, backend).
    fn remember_query(
        &mut self,
        (client, first_ts, id, q, backend): (SocketAddr, u64, u16, QKey, SocketAddr),
    ) {
        let per_socket = self.recent.entry(client).or_default();
        per_socket.push_back((first_ts, id, q, backend));
        if per_socket.len() > 16 {
            per_socket.pop_front();
        }
        self.recent_order.push_back((first_ts, client));
        // Forget what is older than a retry could be, and bound the size.
        let horizon = first_ts.saturating_sub(self.cfg.timeout_ns + self.cfg.retry_grace_ns);
        while let Some(&(ts, socket)) = self.recent_order.front() {
            if ts >= horizon && self.recent_order.len() <= self.cfg.max_legs {
                break;
            }
            self.recent_order.pop_front();
            if let Some(v) = self.recent.get_mut(&socket) {
                if v.front().is_some_and(|r| r.0 <= ts) {
                    v.pop_front();
                }
                if v.is_empty() {
                    self.recent.remove(&socket);
                }
            }
        }
    }

    /// Another query from the same socket within `window` of `ts` (glibc's A/AAAA pair).
    fn sibling_of(&self, l: &Leg, window: u64) -> Option<(u64, u16, QKey, SocketAddr)> {
        let live = self
            .roots_by_socket
            .get(&l.client)
            .into_iter()
            .flatten()
            .filter_map(|id| self.legs.get(id))
            .filter(|o| o.id != l.id)
            .map(|o| (o.first_ts, o.key.id, o.key.q.clone(), o.backend));
        let old = self.recent.get(&l.client).into_iter().flatten().cloned();
        live.chain(old)
            .filter(|(ts, id, _, _)| *id != l.key.id && ts.abs_diff(l.first_ts) <= window)
            .min_by_key(|(ts, ..)| ts.abs_diff(l.first_ts))
    }

    pub fn stats(&self) -> CorrelateStats {
        let mut s = self.stats.clone();
        s.ct_entries_evicted = self.ct.evicted;
        s.loops = self.loops.stats.clone();
        s
    }

    /// `n` packets of a question in an active loop were only counted (storm shedding).
    pub fn summarised(&mut self, name: &str, qtype: &str, class: &str, n: u64, last_ts: u64) {
        let q = QKey {
            name: name.to_ascii_lowercase(),
            qtype: qtype.to_string(),
            class: class.to_string(),
        };
        self.loops.packets(&q, n, true, last_ts);
    }

    /// Walks from a forwarded leg up its chain; reports a cycle if one of its servers is
    /// already on the chain.
    fn check_cycle(&mut self, leg_id: u64, ts: u64) {
        let Some(leaf) = self.legs.get(&leg_id) else {
            return;
        };
        if leaf.parent.is_none() {
            return;
        }
        let mut chain: Vec<&Leg> = vec![leaf];
        let mut cur = leaf.parent;
        while let Some(p) = cur {
            if chain.len() >= 64 {
                break;
            }
            let Some(pl) = self.legs.get(&p) else { break };
            chain.push(pl);
            cur = pl.parent;
        }
        let leaf_ep = endpoint(leaf);
        let Some(i) = chain
            .iter()
            .enumerate()
            .skip(1)
            .find(|(_, anc)| endpoint(anc) == leaf_ep)
            .map(|(i, _)| i)
        else {
            return;
        };
        let hop = |l: &Leg| LoopHop {
            from: l.client.to_string(),
            server: l.server.to_string(),
            backend: l.backend.to_string(),
            at: l
                .backend_at
                .as_ref()
                .map(|(p, ns)| {
                    let ifname = l
                        .hops
                        .iter()
                        .find(|h| h.at == *p)
                        .map(|h| h.ifname.as_str())
                        .unwrap_or("");
                    format!("{ns}/{ifname}")
                })
                .unwrap_or_default(),
            pod: Default::default(),
        };
        let cycle: Vec<LoopHop> = chain[..i].iter().rev().map(|l| hop(l)).collect();
        let hop_count = chain.len().saturating_sub(1) as u64;
        let client = chain.last().map(|r| r.client.to_string());
        let entered = chain.last().map(|r| r.first_ts).unwrap_or(ts);
        let q = leaf.key.q.clone();
        self.loops.cycle(&q, cycle, hop_count, client, entered, ts);
    }

    /// Open legs and transactions (for memory-bound tests and metrics).
    pub fn open_legs(&self) -> usize {
        self.legs.len()
    }

    fn next(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub fn on_conntrack(&mut self, ev: &ConntrackEvent) {
        self.ct.learn(ev);
    }

    /// Queues an observation; it is correlated once the reorder window has passed it.
    pub fn on_observed(&mut self, o: Observed) {
        let ts = o.ts();
        if ts < self.watermark {
            self.stats.late_observations += 1;
            self.process(o);
            return;
        }
        self.seq += 1;
        self.pending.insert((ts, self.seq), o);
        // Bound the reorder buffer: under a flood, correlate early rather than grow.
        while self.pending.len() > self.cfg.max_legs {
            if let Some((_, o)) = self.pending.pop_first() {
                self.watermark = self.watermark.max(o.ts());
                self.process(o);
            }
        }
    }

    fn process(&mut self, o: Observed) {
        match o {
            Observed::Message(m) => self.on_message(m),
            Observed::Drop(d) => self.on_drop(d),
        }
    }

    /// The client port of the flow's original tuple (conntrack), and whether the observed
    /// addresses differ from it.
    fn canonical_client(
        &self,
        proto: u8,
        src: SocketAddr,
        dst: SocketAddr,
        qr: bool,
    ) -> (SocketAddr, bool) {
        match self.ct.lookup(proto, src, dst) {
            Some(m) => (m.orig.src, true),
            None => (if qr { dst } else { src }, false),
        }
    }

    fn on_message(&mut self, o: Observation) {
        let Some(q) = QKey::of(&o.msg) else {
            self.stats.unkeyed += 1;
            return;
        };
        if self.loops.active_for(&q) {
            self.stats.loop_messages += 1;
            self.loops.packets(&q, 1, false, o.ts_ns);
            return;
        }
        let qr = o.msg.qr;
        let (client, by_ct) = self.canonical_client(o.proto, o.src, o.dst, qr);
        let key = LegKey {
            proto: o.proto,
            client_port: client.port(),
            id: o.msg.id,
            q: q.clone(),
        };
        let (seen_client, seen_server) = if qr { (o.dst, o.src) } else { (o.src, o.dst) };
        let hop = |via| Hop {
            ts_ns: o.ts_ns,
            at: o.at,
            netns: o.netns.clone(),
            ifname: o.ifname.clone(),
            src: o.src,
            dst: o.dst,
            dns_id: o.msg.id,
            qr,
            via,
        };
        let existing = self.by_key.get(&key).copied();
        if qr {
            let Some(leg_id) = existing else {
                self.stats.orphan_responses += 1;
                return;
            };
            let max_hops = self.cfg.max_hops_per_leg;
            let Some(leg) = self.legs.get_mut(&leg_id) else {
                return;
            };
            let via = via_for(leg, seen_client, seen_server, by_ct);
            if leg.hops.len() < max_hops {
                leg.hops.push(hop(via));
            } else {
                self.stats.hops_not_stored += 1;
            }
            leg.last_ts = leg.last_ts.max(o.ts_ns);
            match &mut leg.response {
                None => {
                    leg.response = Some(Response::of(o.ts_ns, &o.msg));
                    leg.timed_out = false;
                    let tx = leg.tx;
                    remove_from(&mut self.open_by_q, &q, leg_id);
                    self.touch(tx, o.ts_ns);
                }
                Some(r) => {
                    // The same response captured whole at another hop: it says more.
                    if r.cut.is_some() && o.msg.cut.is_none() {
                        *r = Response {
                            ts_ns: r.ts_ns,
                            ..Response::of(o.ts_ns, &o.msg)
                        };
                    }
                    let tx = leg.tx;
                    self.touch(tx, o.ts_ns);
                }
            }
            return;
        }

        // A query.
        if let Some(leg_id) = existing {
            let settle = self.cfg.settle_ns;
            let max_hops = self.cfg.max_hops_per_leg;
            if let Some(leg) = self.legs.get_mut(&leg_id) {
                let answered_long_ago = leg
                    .response
                    .as_ref()
                    .is_some_and(|r| o.ts_ns > r.ts_ns + settle);
                if !answered_long_ago {
                    // The same query again at a point that already saw it: a retransmission.
                    let again = leg
                        .hops
                        .iter()
                        .any(|h| !h.qr && h.at == o.at && o.ts_ns > h.ts_ns + 100_000_000);
                    if again && o.at == leg.client_point {
                        leg.retransmits += 1;
                    }
                    let via = via_for(leg, seen_client, seen_server, by_ct);
                    let mut moved = false;
                    if seen_server != leg.server
                        && seen_server != leg.backend
                        && o.ts_ns >= leg.last_ts
                    {
                        leg.backend = seen_server;
                        leg.backend_at = Some((o.at, o.netns.clone()));
                        moved = leg.parent.is_some();
                    }
                    if leg.hops.len() < max_hops {
                        leg.hops.push(hop(via));
                    } else {
                        self.stats.hops_not_stored += 1;
                    }
                    if o.ts_ns >= leg.last_ts {
                        leg.delivered_ns = o.netns.clone();
                    }
                    leg.last_ts = leg.last_ts.max(o.ts_ns);
                    let tx = leg.tx;
                    self.touch(tx, o.ts_ns);
                    if moved {
                        self.check_cycle(leg_id, o.ts_ns);
                    }
                    return;
                }
            }
        }

        // A new leg: a forwarder's query, a retry, a TCP fallback, or a new transaction.
        let parent_leg = self.find_parent(&q, seen_client.ip(), &o);
        if let Some(p) = parent_leg {
            let full = self
                .legs
                .get(&p)
                .and_then(|pl| self.txs.get(&pl.tx))
                .is_some_and(|t| t.legs.len() >= self.cfg.max_legs_per_transaction);
            if full {
                self.stats.legs_not_stored += 1;
                self.loops
                    .forward(seen_client.ip().to_string(), &q, o.ts_ns);
                return;
            }
        }
        let id = self.next();
        let (tx, parent, role) = match parent_leg {
            Some(parent) => (
                self.legs.get(&parent).map(|p| p.tx).unwrap_or(0),
                Some(parent),
                LegRole::Forward,
            ),
            None => match self.find_previous_attempt(&q, &o, seen_client) {
                Some((tx, role)) => (tx, None, role),
                None => {
                    let tx = self.next();
                    let (lookup, step) =
                        self.assign_lookup(seen_client.ip(), &o.netns, &q.name, o.ts_ns);
                    self.txs.insert(
                        tx,
                        Transaction {
                            id: tx,
                            lookup,
                            lookup_step: step,
                            legs: Vec::new(),
                            first_ts: o.ts_ns,
                            last_activity: o.ts_ns,
                            wake_at: o.ts_ns + self.cfg.settle_ns,
                        },
                    );
                    self.wakes.insert((o.ts_ns + self.cfg.settle_ns, tx));
                    (tx, None, LegRole::Query)
                }
            },
        };
        let leg = Leg {
            id,
            key: key.clone(),
            tx,
            parent,
            role,
            first_ts: o.ts_ns,
            last_ts: o.ts_ns,
            client: seen_client,
            server: seen_server,
            backend: seen_server,
            backend_at: Some((o.at, o.netns.clone())),
            delivered_ns: o.netns.clone(),
            client_netns: o.netns.clone(),
            client_point: o.at,
            hops: vec![hop(Via::Same)],
            retransmits: 0,
            response: None,
            drop: None,
            race: None,
            timed_out: false,
            cut_short: false,
        };
        if let Some(t) = self.txs.get_mut(&tx) {
            t.legs.push(id);
        }
        self.touch(tx, o.ts_ns);
        self.timeouts.insert((o.ts_ns + self.cfg.timeout_ns, id));
        // A key reused after its leg was answered replaces it in the index.
        self.by_key.insert(key, id);
        push_capped(&mut self.open_by_q, q.clone(), id);
        if parent.is_none() {
            push_capped(&mut self.roots_by_q, (seen_client.ip(), q.clone()), id);
            push_capped(&mut self.roots_by_socket, seen_client, id);
        }
        self.legs.insert(id, leg);
        self.stats.legs += 1;
        match role {
            LegRole::Forward => {
                self.loops
                    .forward(seen_client.ip().to_string(), &q, o.ts_ns);
                self.check_cycle(id, o.ts_ns);
            }
            LegRole::Query | LegRole::Retry | LegRole::TcpFallback => {
                self.loops.client_ask(&q, o.ts_ns)
            }
        }
        self.enforce_bounds();
    }

    /// An open leg whose query was delivered to the address this new query comes from (or,
    /// for loopback servers, into the namespace it comes from), for the same question.
    fn find_parent(&self, q: &QKey, from: IpAddr, o: &Observation) -> Option<u64> {
        let candidates = self.open_by_q.get(q)?;
        candidates
            .iter()
            .rev()
            .filter_map(|id| self.legs.get(id))
            .filter(|l| l.response.is_none() && !l.timed_out)
            .filter(|l| o.ts_ns >= l.first_ts && o.ts_ns - l.first_ts <= self.cfg.forward_window_ns)
            .find(|l| {
                let backend_ip = l.backend.ip();
                let server_ip = l.server.ip();
                // A forwarder sends from the address it was asked on, from its loopback, or
                // (a loopback server) from any address of the namespace it runs in.
                let from_server = backend_ip == from
                    || server_ip == from
                    || ((backend_ip.is_loopback() || from.is_loopback())
                        && l.delivered_ns == o.netns);
                from_server && !Self::peer_client(l, from, &o.netns)
            })
            .map(|l| l.id)
    }

    /// Could a new query from `from` (seen in namespace `ns`) just as well come from a
    /// second client beside `l`'s as from `l`'s server? It does when it comes from the host
    /// (on loopback: the namespace) of `l`'s client and `l` is a client's own query: two
    /// clients of one host, or a client's retry, asking a server is no forward, and a
    /// question can only re-enter a server as a query of a forwarder's own socket.
    fn peer_client(l: &Leg, from: IpAddr, ns: &str) -> bool {
        l.parent.is_none() && l.client.ip() == from && (!from.is_loopback() || l.client_netns == ns)
    }

    /// An earlier root attempt of the same client and question that this one repeats:
    /// after no answer (retry) or a truncated UDP answer (TCP fallback). Only the client's
    /// latest query of that question counts, and only when it went unanswered from the same
    /// socket, or for a while: concurrent or later answered queries of the same name from
    /// other sockets are transactions of their own.
    fn find_previous_attempt(
        &self,
        q: &QKey,
        o: &Observation,
        client: SocketAddr,
    ) -> Option<(u64, LegRole)> {
        const RETRY_MIN_NS: u64 = 500_000_000;
        const MAX_ATTEMPTS: usize = 8;
        let window = self.cfg.timeout_ns + self.cfg.retry_grace_ns;
        let latest = self
            .roots_by_q
            .get(&(client.ip(), q.clone()))
            .into_iter()
            .flatten()
            .filter_map(|id| self.legs.get(id))
            .filter(|l| o.ts_ns >= l.first_ts && o.ts_ns - l.first_ts <= window)
            .filter(|l| l.client_netns == o.netns)
            .max_by_key(|l| l.first_ts)?;
        let attempts = self.txs.get(&latest.tx).map(|t| t.legs.len()).unwrap_or(0);
        if attempts >= MAX_ATTEMPTS {
            return None;
        }
        let role = match &latest.response {
            Some(r) if r.tc && o.proto == tracer_common::IPPROTO_TCP => LegRole::TcpFallback,
            Some(_) => return None,
            None if latest.client == client || o.ts_ns - latest.first_ts >= RETRY_MIN_NS => {
                LegRole::Retry
            }
            None => return None,
        };
        Some((latest.tx, role))
    }

    fn assign_lookup(&mut self, client: IpAddr, netns: &str, name: &str, ts: u64) -> (u64, u32) {
        let window = self.cfg.lookup_window_ns;
        let key = (client, netns.to_string());
        if let Some(state) = self.lookups.get_mut(&key) {
            let related = state.names.iter().any(|n| same_lookup_names(n, name));
            if related && ts.saturating_sub(state.last_ts) <= window {
                state.last_ts = ts;
                let step = match state.names.iter().position(|n| n == name) {
                    Some(i) => i,
                    None => {
                        state.names.push(name.to_string());
                        state.names.len() - 1
                    }
                };
                return (state.id, step as u32);
            }
        }
        let id = self.next();
        if self.lookups.len() >= self.cfg.max_legs {
            // Amortised: prune to at most half, so this runs once per max_legs/2 inserts.
            let horizon = ts.saturating_sub(window);
            self.lookups.retain(|_, s| s.last_ts >= horizon);
            if self.lookups.len() >= self.cfg.max_legs / 2 {
                self.lookups.clear();
            }
        }
        self.lookups.insert(
            key,
            LookupState {
                id,
                names: vec![name.to_string()],
                last_ts: ts,
            },
        );
        (id, 0)
    }

    fn on_drop(&mut self, d: DropObservation) {
        if d.benign {
            return;
        }
        let Some(msg) = &d.msg else {
            self.stats.drops_unmatched += 1;
            return;
        };
        let Some(q) = QKey::of(msg) else {
            self.stats.drops_unmatched += 1;
            return;
        };
        let client_port = match &d.ct {
            Some(ct) => ct.orig.src.port(),
            None if msg.qr => d.dst.port(),
            None => d.src.port(),
        };
        let key = LegKey {
            proto: d.proto,
            client_port,
            id: msg.id,
            q,
        };
        let Some(leg) = self.by_key.get(&key).and_then(|id| self.legs.get_mut(id)) else {
            self.stats.drops_unmatched += 1;
            return;
        };
        if leg.race.is_none()
            && race::is_race_candidate(&d.reason, &d.function, d.ct.as_ref(), d.confirm_failed)
        {
            let backend = d.ct.as_ref().map(|ct| ct.reply.src).unwrap_or(leg.backend);
            leg.race = Some((d.cpu, d.netns_cookie, d.ts_ns, backend, d.confirm_failed));
        }
        if leg.drop.is_none() {
            leg.drop = Some(LegDrop {
                pod: Default::default(),
                ts_ns: d.ts_ns,
                netns: d.netns,
                ifname: d.ifname,
                reason: d.reason,
                location: d.location,
                response: msg.qr,
            });
            self.stats.drops_attached += 1;
        }
        let tx = leg.tx;
        self.touch(tx, d.ts_ns);
    }

    fn touch(&mut self, tx: u64, ts: u64) {
        if let Some(t) = self.txs.get_mut(&tx) {
            t.last_activity = t.last_activity.max(ts);
            // An answer may finish it before the time it was to be looked at.
            let settled = t.last_activity + self.cfg.settle_ns;
            if settled < t.wake_at {
                self.wakes.remove(&(t.wake_at, tx));
                t.wake_at = settled;
                self.wakes.insert((settled, tx));
            }
        }
    }

    fn enforce_bounds(&mut self) {
        while self.legs.len() > self.cfg.max_legs {
            let Some((&oldest, _)) = self.txs.iter().next() else {
                break;
            };
            if let Some(t) = self.txs.remove(&oldest) {
                self.wakes.remove(&(t.wake_at, t.id));
                self.stats.evicted_transactions += 1;
                for id in t.legs {
                    if self.remove_leg(id) {
                        self.stats.evicted_legs += 1;
                    }
                }
            }
        }
    }

    fn remove_leg(&mut self, id: u64) -> bool {
        let Some(leg) = self.legs.remove(&id) else {
            return false;
        };
        self.timeouts
            .remove(&(leg.first_ts + self.cfg.timeout_ns, id));
        if self.by_key.get(&leg.key) == Some(&id) {
            self.by_key.remove(&leg.key);
        }
        remove_from(&mut self.open_by_q, &leg.key.q, id);
        if leg.parent.is_none() {
            remove_from(
                &mut self.roots_by_q,
                &(leg.client.ip(), leg.key.q.clone()),
                id,
            );
            remove_from(&mut self.roots_by_socket, &leg.client, id);
        }
        true
    }

    /// Correlates what the reorder window has released and reports finished transactions.
    /// `now_ns` is in the observations' clock (live: boot time; offline: the file's time).
    pub fn tick(&mut self, now_ns: u64, out: &mut Vec<Record>) {
        let release = now_ns.saturating_sub(self.cfg.reorder_ns);
        while let Some(entry) = self.pending.first_entry() {
            if entry.key().0 > release {
                break;
            }
            let o = entry.remove();
            self.watermark = self.watermark.max(o.ts());
            self.process(o);
        }
        self.finish(now_ns, false, out);
    }

    /// End of input: correlate everything and report every transaction.
    pub fn flush(&mut self, now_ns: u64, out: &mut Vec<Record>) {
        while let Some((_, o)) = self.pending.pop_first() {
            self.watermark = self.watermark.max(o.ts());
            self.process(o);
        }
        self.finish(now_ns, true, out);
    }

    fn finish(&mut self, now: u64, all: bool, out: &mut Vec<Record>) {
        self.loops.tick(now, all);
        let mut loop_records = Vec::new();
        self.loops.drain(&mut loop_records);
        out.extend(loop_records.into_iter().map(Record::Loop));
        // Queries whose time is up: each leg once, when its timeout passes.
        while let Some(&(deadline, id)) = self.timeouts.first() {
            if deadline > now {
                break;
            }
            self.timeouts.pop_first();
            if let Some(leg) = self.legs.get_mut(&id) {
                if leg.response.is_none() && !leg.timed_out {
                    leg.timed_out = true;
                    let q = leg.key.q.clone();
                    remove_from(&mut self.open_by_q, &q, id);
                }
            }
        }
        let mut done: Vec<u64> = Vec::new();
        if all {
            for leg in self.legs.values_mut() {
                if leg.response.is_none() && !leg.timed_out {
                    leg.cut_short = true;
                }
            }
            done.extend(self.txs.keys().copied());
            self.wakes.clear();
        } else {
            // Only transactions due to be looked at: each a bounded number of times.
            while let Some(&(at, id)) = self.wakes.first() {
                if at > now {
                    break;
                }
                self.wakes.pop_first();
                let Some(t) = self.txs.get(&id) else { continue };
                if t.wake_at != at {
                    continue;
                }
                if self.tx_done(t, now) {
                    done.push(id);
                } else {
                    let next = self.next_look(t, now);
                    if let Some(t) = self.txs.get_mut(&id) {
                        t.wake_at = next;
                    }
                    self.wakes.insert((next, id));
                }
            }
            done.sort_unstable();
        }
        for id in done {
            if let Some(t) = self.txs.remove(&id) {
                let rendered = self.render(&t);
                self.races_of(&t, rendered.as_ref());
                if let Some(rec) = rendered {
                    out.push(Record::Transaction(rec));
                    self.stats.transactions += 1;
                }
                for leg in t.legs {
                    if let Some(l) = self.legs.get(&leg).filter(|l| l.parent.is_none()) {
                        let entry = (l.client, l.first_ts, l.key.id, l.key.q.clone(), l.backend);
                        self.remember_query(entry);
                    }
                    self.remove_leg(leg);
                }
            }
        }
        out.extend(self.race_out.drain(..).map(Record::Race));
    }

    /// Race records of a finished transaction: race drops with their evidence, or a
    /// suspected race (an unanswered query of an A/AAAA pair retried at the timeout).
    fn races_of(&mut self, t: &Transaction, rec: Option<&TransactionRecord>) {
        const PAIR_WINDOW_NS: u64 = 100_000_000;
        // Most transactions have nothing to say here: check before copying anything.
        let candidate = t.legs.iter().filter_map(|id| self.legs.get(id)).any(|l| {
            l.race.is_some() || (l.parent.is_none() && l.response.is_none() && l.drop.is_none())
        });
        if !candidate {
            return;
        }
        let legs: Vec<Leg> = t
            .legs
            .iter()
            .filter_map(|id| self.legs.get(id))
            .cloned()
            .collect();
        let Some(root) = legs.first() else { return };
        let retry = legs
            .iter()
            .filter(|l| l.parent.is_none() && l.role == LegRole::Retry)
            .map(|l| l.first_ts.saturating_sub(t.first_ts))
            .min();
        let total = rec.and_then(|r| r.latency_ns);
        let fmt = crate::time::format_duration;
        let question = |q: &QKey| crate::output::record::QuestionRecord {
            name: q.name.clone(),
            qtype: q.qtype.clone(),
            class: q.class.clone(),
        };
        for l in legs.iter().filter(|l| l.parent.is_none()) {
            let sibling = self.sibling_of(l, PAIR_WINDOW_NS);
            let pair_start = sibling
                .as_ref()
                .map(|s| s.0.min(l.first_ts))
                .unwrap_or(l.first_ts);
            let sibling_rec = sibling.as_ref().map(|(ts, id, q, backend)| RaceQuery {
                dns_id: *id,
                question: question(q),
                backend: backend.to_string(),
                offset_ns: ts.saturating_sub(pair_start),
            });
            let (verdict, cpu, counters, confirmed, drop_ts, backend, confirm) = match l.race {
                Some((cpu, netns, ts, backend, confirm)) => {
                    let c = self.ct_samples.around(netns, cpu, ts);
                    let confirmed = c
                        .as_ref()
                        .is_some_and(|c| c.insert_failed > 0 || c.drop > 0);
                    (
                        RaceVerdict::RaceDrop,
                        Some(cpu),
                        c.unwrap_or_default(),
                        confirmed,
                        Some(ts),
                        backend,
                        confirm,
                    )
                }
                None if l.drop.is_none()
                    && l.response.is_none()
                    && (retry.is_some() || l.retransmits > 0)
                    && sibling.is_some() =>
                {
                    (
                        RaceVerdict::Suspected,
                        None,
                        race::CounterDeltas::default(),
                        false,
                        None,
                        l.backend,
                        None,
                    )
                }
                None => continue,
            };
            match verdict {
                RaceVerdict::RaceDrop => self.stats.races.race_drops += 1,
                RaceVerdict::Suspected => self.stats.races.suspected += 1,
                RaceVerdict::ResolvedClash => {}
            }
            let what = match verdict {
                RaceVerdict::RaceDrop => format!(
                    "{} dropped by conntrack race at +{}",
                    l.key.q.qtype,
                    fmt(drop_ts.unwrap_or(l.first_ts).saturating_sub(pair_start))
                ),
                _ => format!(
                    "{} unanswered, no kernel evidence (suspected race)",
                    l.key.q.qtype
                ),
            };
            let how = match (retry, total) {
                (Some(r), _) => format!(", retried at +{}", fmt(r)),
                _ => ", no retry seen".to_string(),
            };
            let summary = match total {
                Some(total) => format!(
                    "lookup of {} took {}: {what}{how}",
                    l.key.q.name,
                    fmt(total)
                ),
                None => format!("lookup of {}: {what}{how}", l.key.q.name),
            };
            self.race_out.push(RaceRecord {
                pod: Default::default(),
                verdict,
                ts_ns: drop_ts.unwrap_or(l.first_ts),
                time: self.clock.wall(drop_ts.unwrap_or(l.first_ts)),
                netns: l.drop.as_ref().map(|d| d.netns.clone()).unwrap_or_default(),
                client: l.client.to_string(),
                client_netns: l.client_netns.clone(),
                dropped: Some(RaceQuery {
                    dns_id: l.key.id,
                    question: question(&l.key.q),
                    backend: backend.to_string(),
                    offset_ns: l.first_ts.saturating_sub(pair_start),
                }),
                sibling: sibling_rec.clone(),
                cpu,
                counters,
                counter_confirmed: confirmed,
                kernel_confirm_failed: confirm,
                drop_reason: l.drop.as_ref().map(|d| d.reason.clone()),
                drop_location: l.drop.as_ref().map(|d| d.location.clone()),
                retry_ns: retry,
                total_delay_ns: total,
                summary,
            });
        }
        let _ = root;
    }

    /// The earliest time a transaction that is not done yet could be, unless something new
    /// happens to it (a new hop touches it, which looks at it sooner if need be).
    fn next_look(&self, t: &Transaction, now: u64) -> u64 {
        let mut next = t.last_activity + self.cfg.settle_ns;
        let mut last_root: Option<&Leg> = None;
        for l in t.legs.iter().filter_map(|id| self.legs.get(id)) {
            if !l.closed() {
                next = next.max(l.first_ts + self.cfg.timeout_ns);
            }
            if let Some((_, netns, ts, _, _)) = l.race {
                if !self.ct_samples.has_after(netns, ts) && now < ts + 2_000_000_000 {
                    // Counters come every 200 ms.
                    next = next.max((now + 100_000_000).min(ts + 2_000_000_000));
                }
            }
            if l.parent.is_none() && last_root.is_none_or(|r| l.first_ts >= r.first_ts) {
                last_root = Some(l);
            }
        }
        if let Some(r) = last_root.filter(|r| r.response.is_none()) {
            next = next.max(r.first_ts + self.cfg.timeout_ns + self.cfg.retry_grace_ns);
        }
        next.max(now + 1)
    }

    fn tx_done(&self, t: &Transaction, now: u64) -> bool {
        if now < t.last_activity + self.cfg.settle_ns {
            return false;
        }
        let legs: Vec<&Leg> = t.legs.iter().filter_map(|id| self.legs.get(id)).collect();
        if !legs.iter().all(|l| l.closed()) {
            return false;
        }
        // A race drop is judged with the counters sampled after it (they come every 200 ms).
        let waiting_for_counters = legs.iter().any(|l| {
            l.race.is_some_and(|(_, netns, ts, _, _)| {
                !self.ct_samples.has_after(netns, ts) && now < ts + 2_000_000_000
            })
        });
        if waiting_for_counters {
            return false;
        }
        // The last root attempt timed out: its retry may still come.
        let last_root = legs
            .iter()
            .filter(|l| l.parent.is_none())
            .max_by_key(|l| l.first_ts);
        match last_root {
            Some(l) if l.timed_out => {
                now >= l.first_ts + self.cfg.timeout_ns + self.cfg.retry_grace_ns
            }
            _ => true,
        }
    }

    fn render(&self, t: &Transaction) -> Option<TransactionRecord> {
        let legs: Vec<&Leg> = t.legs.iter().filter_map(|id| self.legs.get(id)).collect();
        let root = legs.first()?;
        let index_of = |id: u64| legs.iter().position(|l| l.id == id);
        let timeout_s = self.cfg.timeout_ns as f64 / 1e9;

        let leg_records: Vec<LegRecord> = legs
            .iter()
            .map(|l| {
                let mut hops: Vec<&Hop> = l.hops.iter().collect();
                hops.sort_by_key(|h| h.ts_ns);
                let join = if hops.iter().any(|h| h.via == Via::Conntrack) {
                    "conntrack"
                } else if hops.iter().any(|h| h.via == Via::Fallback) {
                    "fallback"
                } else {
                    "same-tuple"
                };
                // A query leaves an interface in one direction and its answer comes back
                // through the same interface in the other.
                let query_at = |at: ObservationPoint| {
                    hops.iter()
                        .filter(|h| !h.qr && same_iface(h.at, at))
                        .map(|h| h.ts_ns)
                        .min()
                };
                let outcome = match (&l.response, &l.drop) {
                    (Some(r), _) if r.tc => "truncated",
                    (Some(_), _) => "answered",
                    (None, Some(_)) => "dropped",
                    (None, None) if l.cut_short => "pending",
                    (None, None) => "unanswered",
                };
                let latency = l.response.as_ref().and_then(|r| {
                    let back_at_client = hops
                        .iter()
                        .filter(|h| h.qr && same_iface(h.at, l.client_point))
                        .map(|h| h.ts_ns)
                        .min()
                        .unwrap_or(r.ts_ns);
                    back_at_client.checked_sub(l.first_ts)
                });
                LegRecord {
                    id: l.id,
                    parent: l.parent.and_then(index_of),
                    role: l.role,
                    proto: if l.key.proto == tracer_common::IPPROTO_TCP {
                        "tcp"
                    } else {
                        "udp"
                    },
                    client: l.client.to_string(),
                    server: l.server.to_string(),
                    backend: l.backend.to_string(),
                    dns_id: l.key.id,
                    join,
                    outcome,
                    rcode: l.response.as_ref().map(|r| r.rcode.clone()),
                    answers: l
                        .response
                        .as_ref()
                        .map(|r| r.answers.clone())
                        .unwrap_or_default(),
                    answer_cut: l.response.as_ref().and_then(|r| r.cut),
                    latency_ns: latency,
                    retransmits: l.retransmits,
                    drop: l.drop.clone(),
                    hops: hops
                        .iter()
                        .map(|h| HopRecord {
                            pod: Default::default(),
                            ts_ns: h.ts_ns,
                            netns: h.netns.clone(),
                            ifname: h.ifname.clone(),
                            dir: h.at.dir.as_str(),
                            src: h.src.to_string(),
                            dst: h.dst.to_string(),
                            dns_id: h.dns_id,
                            qr: h.qr,
                            latency_ns: if h.qr {
                                query_at(h.at).and_then(|q| h.ts_ns.checked_sub(q))
                            } else {
                                None
                            },
                        })
                        .collect(),
                }
            })
            .collect();

        // Outcome of the whole transaction: the answer the client got, at its first point.
        let roots: Vec<&&Leg> = legs.iter().filter(|l| l.parent.is_none()).collect();
        let final_root = roots
            .iter()
            .rev()
            .find(|l| l.response.as_ref().is_some_and(|r| !r.tc))
            .or(roots.last());
        let final_root = final_root?;
        let retried = roots.iter().any(|l| l.role == LegRole::Retry) || root.retransmits > 0;
        let tcp = roots.iter().any(|l| l.role == LegRole::TcpFallback);
        let end_ts = final_root.response.as_ref().map(|r| {
            final_root
                .hops
                .iter()
                .filter(|h| h.qr && same_iface(h.at, final_root.client_point))
                .map(|h| h.ts_ns)
                .min()
                .unwrap_or(r.ts_ns)
        });
        let latency = end_ts.and_then(|e| e.checked_sub(t.first_ts));
        let fmt_lat = crate::time::format_duration;
        let dropped = legs.iter().find_map(|l| l.drop.as_ref());
        let (outcome, summary) = match (&final_root.response, latency) {
            (Some(r), Some(lat)) => {
                let answers = match r.answers.len() {
                    0 => String::new(),
                    1..=3 => format!(" {}", r.answers.join(", ")),
                    n => format!(" {}, … ({n} answers)", r.answers[..2].join(", ")),
                };
                let first_timed_out = roots
                    .first()
                    .is_some_and(|l| l.timed_out || l.response.is_none());
                let how = if tcp {
                    format!(
                        "truncated, retried over TCP, {}{} at +{}",
                        r.rcode,
                        answers,
                        fmt_lat(lat)
                    )
                } else if retried && first_timed_out {
                    let cause = match dropped {
                        Some(d) => format!("query dropped ({} at {}), ", d.reason, d.location),
                        None => String::new(),
                    };
                    format!(
                        "{cause}timeout after {timeout_s:.1} s, retried, answered at +{}: {}{}",
                        fmt_lat(lat),
                        r.rcode,
                        answers
                    )
                } else {
                    format!("{}{} in {}", r.rcode, answers, fmt_lat(lat))
                };
                let how = match &r.cut {
                    Some(c) => format!("{how}; {}", cut_note(c, r.answers.len())),
                    None => how,
                };
                ("answered", how)
            }
            _ => match dropped {
                Some(d) => (
                    "dropped",
                    format!(
                        "dropped by the kernel ({} at {}), unanswered{}",
                        d.reason,
                        d.location,
                        if retried { ", retried" } else { "" }
                    ),
                ),
                None if final_root.cut_short => {
                    ("pending", "no answer yet when the input ended".to_string())
                }
                None => (
                    "unanswered",
                    format!(
                        "unanswered after {timeout_s:.1} s{}",
                        if retried {
                            format!(
                                ", retried {} time(s)",
                                roots.len().saturating_sub(1).max(root.retransmits as usize)
                            )
                        } else {
                            String::new()
                        }
                    ),
                ),
            },
        };
        let q = root.key.q.clone();
        Some(TransactionRecord {
            pod: Default::default(),
            id: t.id,
            lookup: LookupRef {
                id: t.lookup,
                step: t.lookup_step,
            },
            ts_ns: t.first_ts,
            time: self.clock.wall(t.first_ts),
            client: root.client.to_string(),
            client_netns: root.client_netns.clone(),
            question: QuestionRecord {
                name: q.name,
                qtype: q.qtype,
                class: q.class,
            },
            outcome,
            rcode: final_root.response.as_ref().map(|r| r.rcode.clone()),
            answers: final_root
                .response
                .as_ref()
                .map(|r| r.answers.clone())
                .unwrap_or_default(),
            answer_cut: final_root.response.as_ref().and_then(|r| r.cut),
            latency_ns: latency,
            summary,
            legs: leg_records,
        })
    }
}

fn via_for(leg: &Leg, seen_client: SocketAddr, seen_server: SocketAddr, by_ct: bool) -> Via {
    if seen_client == leg.client && seen_server == leg.server {
        return Via::Same;
    }
    if by_ct {
        Via::Conntrack
    } else {
        Via::Fallback
    }
}

fn same_iface(a: ObservationPoint, b: ObservationPoint) -> bool {
    a.netns == b.netns && a.ifindex == b.ifindex
}

/// Candidates kept per key of an index (the newest): a forwarder's query follows its
/// parent's closely, a retry or sibling is the client's latest query, so older ones are
/// never the answer, and every lookup and removal stays O(1) however often one question or
/// socket repeats.
const MAX_CANDIDATES: usize = 64;

fn push_capped<K: std::hash::Hash + Eq>(index: &mut HashMap<K, Vec<u64>>, key: K, id: u64) {
    let v = index.entry(key).or_default();
    if v.len() >= MAX_CANDIDATES {
        v.remove(0);
    }
    v.push(id);
}

fn remove_from<K: std::hash::Hash + Eq>(index: &mut HashMap<K, Vec<u64>>, key: &K, id: u64) {
    if let Some(v) = index.get_mut(key) {
        v.retain(|x| *x != id);
        if v.is_empty() {
            index.remove(key);
        }
    }
}

#[cfg(test)]
mod tests;
