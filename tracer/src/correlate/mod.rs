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
pub(crate) mod ctmap;
pub(crate) mod detector;
mod index;
mod join;
mod lookup;
mod model;
mod proxy;
pub(crate) mod record;
mod render;
mod reorder;
pub(crate) mod sip;

use std::{
    collections::{hash_map::Entry, BTreeSet, HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use serde::Serialize;

pub(crate) use crate::decode::observation::{
    DropObservation, Observation, Observed, FRAGMENT_LOSS,
};
use crate::{
    decode::dns::{Cut, DnsMessage, RrClass, RrType},
    event::{ConntrackEvent, CtStatsSample, ObservationPoint, Proto},
    time::Clock,
};
use ctmap::CtMap;
use detector::{Attempt, Control, Cycle, CycleHop, Decided, Detector, LegEvent};
use index::LegIndex;
use lookup::Lookups;
pub(crate) use model::QKey;
use model::*;
pub(crate) use record::LegRole;
use record::{
    Answered, HopRecord, Join, LegDrop, LegLoop, LegOutcome, LegRecord, LookupRef, NodeCache,
    Outcome, PodProxy, QuestionRecord, Summary, TransactionRecord,
};

/// What the correlate and detect stages report, in the order they decide it; the pipeline
/// hands each on to the sinks as a [`Record`](crate::output::record::Record). `R`: the
/// detectors' reports ([`Detector::Report`]).
#[derive(Clone, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "made and turned into a Record at once, never stored"
)]
pub enum CorrelateReport<R> {
    Transaction(TransactionRecord),
    Detected(R),
}

/// Windows and bounds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CorrelateConfig {
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
    /// The same query seen again at the same point at least this much later is a
    /// retransmission (earlier: the same packet's copies).
    pub retransmit_gap_ns: u64,
    /// A new query from the same client for the same question counts as a retry of the
    /// unanswered one only this long after it (sooner: a parallel query).
    pub retry_min_ns: u64,
    /// An A and an AAAA query from one socket within this window are a pair (glibc sends
    /// both at once): the sibling of a race drop.
    pub pair_window_ns: u64,
    /// How long a race drop waits for the conntrack counters sampled after it (they come
    /// every 200 ms), and how often it looks again meanwhile.
    pub counters_wait_ns: u64,
    pub counters_poll_ns: u64,
    /// How long after a response was seen on the way a root leg waits for it at its
    /// client's interface before it is reported: a fragmented answer missing a fragment
    /// there is known only after the reassembly timeout (2 s).
    pub answer_grace_ns: u64,
    /// Quiet time after which a forwarding loop counts as ended.
    pub loop_end_ns: u64,
    /// A loop that lasts is reported again at most this often (`ongoing`).
    pub loop_update_ns: u64,
    pub max_legs: usize,
    /// Bytes the legs, their hops and indexes may take (as counted by the leg table): a
    /// loop's legs hold up to `max_hops_per_leg` hops each, so `max_legs` alone bounds
    /// memory only at 64 times what the usual legs take. Beyond, the oldest transaction is
    /// reported early, as at `max_legs`.
    pub max_leg_bytes: usize,
    pub max_ct_entries: usize,
    pub max_hops_per_leg: usize,
    /// Legs kept per transaction (a loop grows its tree without end).
    pub max_legs_per_transaction: usize,
    /// The node's own network namespace: a server there is a node cache (see
    /// [`record::NodeCache`]).
    pub node_netns: Option<u64>,
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
            retransmit_gap_ns: 100_000_000,
            retry_min_ns: 500_000_000,
            pair_window_ns: 100_000_000,
            counters_wait_ns: 2_000_000_000,
            counters_poll_ns: 100_000_000,
            answer_grace_ns: 2_500_000_000,
            loop_end_ns: 2_000_000_000,
            loop_update_ns: 1_000_000_000,
            max_legs: 65_536,
            max_leg_bytes: 64 << 20,
            max_ct_entries: 262_144,
            max_hops_per_leg: 64,
            max_legs_per_transaction: 64,
            node_netns: None,
        }
    }
}

/// Counters of the correlate stage, and of its detectors (`S`: [`Detector::Stats`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct CorrelateStats<S> {
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
    /// The detectors' own counters, as fields of this object.
    #[serde(flatten)]
    pub detect: S,
}

/// A reported client query: (first ts, dns id, question, backend).
type RecentQuery = (u64, u16, QKey, SocketAddr);

/// A socket's recent queries, oldest first. Most sockets ask once (a resolver takes a new
/// port a query) or twice (an A/AAAA pair): one is kept without a queue's allocation.
enum RecentQueries {
    One(RecentQuery),
    Many(VecDeque<RecentQuery>),
}

/// Recent queries kept per socket (the newest).
const RECENT_PER_SOCKET: usize = 16;

impl RecentQueries {
    fn push(&mut self, r: RecentQuery) {
        match self {
            RecentQueries::Many(v) => {
                v.push_back(r);
                if v.len() > RECENT_PER_SOCKET {
                    v.pop_front();
                }
            }
            RecentQueries::One(_) => {
                let mut v = VecDeque::with_capacity(2);
                if let RecentQueries::One(first) =
                    std::mem::replace(self, RecentQueries::Many(VecDeque::new()))
                {
                    v.push_back(first);
                }
                v.push_back(r);
                *self = RecentQueries::Many(v);
            }
        }
    }

    /// Takes the oldest off if it was first seen at `ts` or before; true when none is left.
    fn forget_until(&mut self, ts: u64) -> bool {
        match self {
            RecentQueries::One(r) => r.0 <= ts,
            RecentQueries::Many(v) => {
                if v.front().is_some_and(|r| r.0 <= ts) {
                    v.pop_front();
                }
                v.is_empty()
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &RecentQuery> {
        let (one, many) = match self {
            RecentQueries::One(r) => (Some(r), None),
            RecentQueries::Many(v) => (None, Some(v)),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

/// The correlator. Feed it observations and conntrack events; call [`Correlator::tick`]
/// regularly (live: every 50 ms; offline: as file time advances) and
/// [`Correlator::flush`] at the end. `D`: the detect stage, shown what the correlator sees
/// as it happens (`crate::detect::Detectors`).
pub(crate) struct Correlator<D: Detector> {
    cfg: CorrelateConfig,
    clock: Clock,
    ct: CtMap,
    pending: reorder::Reorder,
    watermark: u64,
    /// Open legs, by id and by what joins a hop, finds a forwarder's parent, a retry's
    /// earlier attempt or a query's A/AAAA sibling.
    legs: LegIndex,
    /// By the correlator's own ids (a counter): a fast hasher is safe.
    txs: HashMap<u64, Transaction, foldhash::fast::RandomState>,
    /// Transaction ids in creation (= id) order, for evicting the oldest; ids of reported
    /// ones are skipped when met, and swept out once they are most of it.
    tx_order: VecDeque<u64>,
    /// (time, transaction) to look at: whether it is done, or when to look again; one entry
    /// per transaction (its `wake_at`).
    wakes: BTreeSet<(u64, u64)>,
    /// When each open leg's query goes unanswered.
    timeouts: Timeouts,
    lookups: Lookups,
    next_id: u64,
    stats: CorrelateStats<D::Stats>,
    detect: D,
    /// The detectors' reports of this turn, before they go out.
    reports: Vec<D::Report>,
    /// What the detectors asked of the pipeline, until it takes them.
    controls: Vec<Control>,
    /// Recent client queries by socket, to find the sibling of a dropped one (A/AAAA pair)
    /// after its own transaction has been reported: (first ts, dns id, question, backend).
    recent: HashMap<SocketAddr, RecentQueries, sip::Sip>,
    /// `recent`'s entries in insertion order, for pruning the oldest in O(1).
    recent_order: VecDeque<(u64, SocketAddr)>,
    /// The questions of the last messages seen (the decode stage shares one decoded
    /// message between the hops that carried the same bytes).
    keys: KeyCache,
    /// How the last message observation joined (see [`JoinMemo`]).
    join_memo: Option<JoinMemo>,
    /// Where the node cache sends its misses (servers and backends; at most
    /// [`MAX_CACHE_UPSTREAMS`]): a client asking one of them directly bypasses the cache.
    cache_upstreams: std::collections::HashSet<IpAddr>,
    /// Hops a new leg has room for: as many as the last leg taken out had (within
    /// [`MIN_HOP_ROOM`]..=[`MAX_HOP_ROOM`]).
    hop_room: usize,
}

/// Room for the query's hop and its answer's at least, and at most for a node's usual
/// path and then some: a leg of more hops grows its vector.
const MIN_HOP_ROOM: usize = 4;
const MAX_HOP_ROOM: usize = 16;

/// Addresses kept of the node cache's upstreams.
const MAX_CACHE_UPSTREAMS: usize = 64;

/// The join of the last message observation: the next end of a veth sees the same packet
/// (the same decoded message, transport and addresses), and joins it the same way as long
/// as no leg came or went and conntrack taught nothing new (the generations), so its
/// conntrack lookup and leg-key hash are not made again. Holds its message, so the address
/// compared is never another message's.
struct JoinMemo {
    msg: Arc<DnsMessage>,
    proto: Proto,
    src: SocketAddr,
    dst: SocketAddr,
    /// (legs, conntrack) generations it holds for.
    generation: (u64, u64),
    client: SocketAddr,
    by_ct: bool,
    /// What the leg index answers for the observation's key.
    leg: Option<u64>,
}

impl JoinMemo {
    /// The same packet as the one it was made for (at another point).
    fn is_for(&self, o: &Observation) -> bool {
        self.proto == o.proto
            && self.src == o.src
            && self.dst == o.dst
            && Arc::ptr_eq(&self.msg, &o.msg)
    }
}

/// (deadline, leg): when each open leg's query goes unanswered, earliest first. Legs are
/// made in time order, so a new deadline goes on the back of a queue (one made of a late
/// observation, earlier than the back, goes to an ordered set instead): no tree insert
/// and removal per leg. A leg that is gone leaves its entry behind, passed over when due
/// ([`index::LegIndex::time_out`] does nothing for it), and the entries of gone legs are
/// swept out once they are most of them (as `tx_order`'s).
#[derive(Default)]
struct Timeouts {
    queue: VecDeque<(u64, u64)>,
    late: BTreeSet<(u64, u64)>,
}

impl Timeouts {
    fn push(&mut self, deadline: u64, leg: u64) {
        if self.queue.back().is_none_or(|&b| b <= (deadline, leg)) {
            self.queue.push_back((deadline, leg));
        } else {
            self.late.insert((deadline, leg));
        }
    }

    /// The leg of the earliest entry, if it is due by `now`, taken off.
    fn pop_due(&mut self, now: u64) -> Option<u64> {
        let queued = self.queue.front().copied();
        let late = self.late.first().copied();
        let first = match (queued, late) {
            (Some(q), Some(l)) => q.min(l),
            (q, l) => q.or(l)?,
        };
        if first.0 > now {
            return None;
        }
        if Some(first) == queued {
            self.queue.pop_front();
        } else {
            self.late.pop_first();
        }
        Some(first.1)
    }

    fn len(&self) -> usize {
        self.queue.len() + self.late.len()
    }

    /// Forgets the entries of legs no longer open once they could be most of them (more
    /// than twice the `open` legs, and 64): amortised O(1) per leg.
    fn sweep(&mut self, open: usize, is_open: impl Fn(u64) -> bool) {
        if self.len() > 2 * open + 64 {
            self.queue.retain(|&(_, id)| is_open(id));
            self.late.retain(|&(_, id)| is_open(id));
        }
    }
}

/// Question keys of the last [`KEYS`] messages, by the message's allocation: the next hop
/// of a message reuses its key (lowercased name, digest) instead of making it again. Each
/// entry holds its message, so an address is never reused while it is here.
#[derive(Default)]
struct KeyCache {
    entries: Vec<(Arc<DnsMessage>, QKey)>,
    next: usize,
}

/// A message's hops on a node come within microseconds of each other; a few more entries
/// cover A and AAAA interleaved and several clients at once.
const KEYS: usize = 8;

impl KeyCache {
    fn get(&mut self, msg: &Arc<DnsMessage>) -> Option<QKey> {
        if let Some((_, q)) = self.entries.iter().find(|(m, _)| Arc::ptr_eq(m, msg)) {
            return Some(q.clone());
        }
        let asked = msg.questions.first()?;
        // Another message of the same question (the query of this answer): its key, not
        // another lowercased copy of the name and its digest. A key's name is in lower
        // case, so it is the one `QKey::of` would make exactly when it equals the name
        // asked but for case.
        let same = |q: &QKey| {
            q.qtype == asked.qtype
                && q.class == asked.class
                && q.name.eq_ignore_ascii_case(&asked.name)
        };
        let q = match self.entries.iter().rev().find(|(_, q)| same(q)) {
            Some((_, q)) => q.clone(),
            None => QKey::asked(&asked.name, asked.qtype, asked.class),
        };
        let entry = (Arc::clone(msg), q.clone());
        if self.entries.len() < KEYS {
            self.entries.push(entry);
        } else if let Some(slot) = self.entries.get_mut(self.next) {
            *slot = entry;
            self.next = (self.next + 1) % KEYS;
        }
        Some(q)
    }
}

impl<D: Detector> Correlator<D> {
    pub(crate) fn with_detector(cfg: CorrelateConfig, clock: Clock, detect: D) -> Self {
        Self {
            clock,
            ct: CtMap::new(cfg.max_ct_entries),
            cfg,
            pending: reorder::Reorder::default(),
            watermark: 0,
            legs: LegIndex::default(),
            txs: HashMap::default(),
            tx_order: VecDeque::new(),
            wakes: BTreeSet::new(),
            timeouts: Timeouts::default(),
            lookups: Lookups::new(cfg.lookup_window_ns, cfg.max_legs),
            next_id: 1,
            stats: CorrelateStats::default(),
            detect,
            reports: Vec::new(),
            controls: Vec::new(),
            recent: HashMap::default(),
            recent_order: VecDeque::new(),
            keys: KeyCache::default(),
            join_memo: None,
            cache_upstreams: Default::default(),
            hop_room: MIN_HOP_ROOM,
        }
    }

    /// A conntrack statistics sample: the detectors' (races are confirmed by them).
    pub(crate) fn on_ct_stats(&mut self, s: CtStatsSample) {
        self.detect.ct_stats(&s);
    }

    /// What the detectors asked of the pipeline since the last call.
    pub(crate) fn take_controls(&mut self, out: &mut Vec<Control>) {
        out.append(&mut self.controls);
    }

    /// Keeps a reported client query for a while: (socket, first ts, id, question, backend).
    fn remember_query(
        &mut self,
        (client, first_ts, id, q, backend): (SocketAddr, u64, u16, QKey, SocketAddr),
    ) {
        let r = (first_ts, id, q, backend);
        match self.recent.entry(client) {
            Entry::Occupied(e) => e.into_mut().push(r),
            Entry::Vacant(e) => {
                e.insert(RecentQueries::One(r));
            }
        }
        self.recent_order.push_back((first_ts, client));
        // Forget what is older than a retry could be, and bound the size.
        let horizon = first_ts.saturating_sub(self.cfg.timeout_ns + self.cfg.retry_grace_ns);
        while let Some(&(ts, socket)) = self.recent_order.front() {
            if ts >= horizon && self.recent_order.len() <= self.cfg.max_legs {
                break;
            }
            self.recent_order.pop_front();
            // One hash of the socket, whether its entry goes or stays.
            if let Entry::Occupied(mut e) = self.recent.entry(socket) {
                if e.get_mut().forget_until(ts) {
                    e.remove();
                }
            }
        }
    }

    /// Another query from the same socket within `window` of `ts` (glibc's A/AAAA pair).
    fn sibling_of(&self, l: &Leg, window: u64) -> Option<(u64, u16, QKey, SocketAddr)> {
        let near = |ts: u64| ts.abs_diff(l.first_ts) <= window;
        let live = self
            .legs
            .socket_candidates(&l.client)
            .iter()
            .filter(|c| c.id != l.id && near(c.first_ts))
            .filter_map(|c| self.legs.get(&c.id))
            .map(|o| (o.first_ts, o.key.id, &o.key.q, o.backend));
        let old = self
            .recent
            .get(&l.client)
            .into_iter()
            .flat_map(RecentQueries::iter)
            .map(|(ts, id, q, backend)| (*ts, *id, q, *backend));
        live.chain(old)
            .filter(|(ts, id, _, _)| *id != l.key.id && near(*ts))
            .min_by_key(|(ts, ..)| ts.abs_diff(l.first_ts))
            .map(|(ts, id, q, backend)| (ts, id, q.clone(), backend))
    }

    pub(crate) fn stats(&self) -> CorrelateStats<D::Stats> {
        let mut s = self.stats.clone();
        s.ct_entries_evicted = self.ct.evicted;
        self.detect.stats(&mut s.detect);
        s
    }

    /// `n` packets of a question in an active loop were only counted (storm shedding).
    pub(crate) fn summarised(
        &mut self,
        name: &str,
        qtype: RrType,
        class: RrClass,
        n: u64,
        last_ts: u64,
    ) {
        let q = QKey::asked(name, qtype, class);
        self.detect.summarised(&q, n, last_ts);
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
        let hop = |l: &Leg| CycleHop {
            from: l.client,
            server: l.server,
            backend: l.backend,
            at: l.backend_at.as_ref().map(|(p, ns)| {
                let ifname = l
                    .hops
                    .iter()
                    .find(|h| h.at == *p)
                    .map(|h| h.ifname.to_string())
                    .unwrap_or_default();
                (ns.to_string(), ifname)
            }),
        };
        let hops: Vec<CycleHop> = chain[..i].iter().rev().map(|l| hop(l)).collect();
        let hop_count = chain.len().saturating_sub(1) as u64;
        let client = chain.last().map(|r| r.client);
        let entered = chain.last().map(|r| r.first_ts).unwrap_or(ts);
        let q = leaf.key.q.clone();
        // The leg says it closed a cycle: its record carries the mark the spans read.
        if let Some(leaf) = self.legs.get_mut(&leg_id) {
            leaf.closes_cycle = Some((
                u32::try_from(i).unwrap_or(u32::MAX),
                u32::try_from(hop_count).unwrap_or(u32::MAX),
            ));
        }
        self.detect.leg(&LegEvent::Cycle(Cycle {
            q: &q,
            hops,
            hop_count,
            client,
            entered_ts: entered,
            ts,
        }));
    }

    /// Every table within its bound (the fuzz harness's check after each input event,
    /// `crate::fuzzing`): what is wrong, if anything.
    pub(crate) fn check_bounds(&self) -> Result<(), String> {
        let c = &self.cfg;
        let bounds = [
            ("open legs", self.legs.len(), c.max_legs),
            ("leg bytes", self.legs.bytes(), c.max_leg_bytes),
            ("open transactions", self.txs.len(), c.max_legs),
            (
                "transaction order",
                self.tx_order.len(),
                2 * self.txs.len() + 65,
            ),
            ("wakes", self.wakes.len(), self.txs.len()),
            ("timeouts", self.timeouts.len(), 2 * self.legs.len() + 64),
            ("reorder buffer", self.pending.len(), c.max_legs),
            ("conntrack map", self.ct.len(), c.max_ct_entries.max(4)),
            ("lookups", self.lookups.len(), c.max_legs),
            ("recent queries", self.recent_order.len(), c.max_legs + 1),
            ("recent sockets", self.recent.len(), self.recent_order.len()),
            (
                "cache upstreams",
                self.cache_upstreams.len(),
                MAX_CACHE_UPSTREAMS,
            ),
        ];
        match bounds.iter().find(|(_, n, max)| n > max) {
            Some((what, n, max)) => Err(format!("{what}: {n} > {max}")),
            None => self.detect.check_bounds(),
        }
    }

    /// Open legs and transactions (for memory-bound tests).
    #[cfg(test)]
    pub(crate) fn open_legs(&self) -> usize {
        self.legs.len()
    }

    fn next(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }
}

#[cfg(test)]
mod join_tests;
#[cfg(test)]
mod outcome_tests;
#[cfg(test)]
mod proxy_tests;
#[cfg(test)]
mod tables_tests;
#[cfg(test)]
pub(crate) mod test_support;
